"""tfaccel/policy_client.py on its own: its command line and its resize, number for number."""

import os
import subprocess
import sys

import ale_py
import numpy as np
import pytest
from ale_py import roms

from tfaccel import policy_client
from tfaccel.envs.frames import Resizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def client(*args):
    return subprocess.run(
        [sys.executable, "-m", "tfaccel.policy_client", "pretrained/a2c_pong", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--epsilon=7", "error: epsilon must be in [0, 1], got 7.0"),
        ("--epsilon=-0.5", "error: epsilon must be in [0, 1], got -0.5"),
        ("--episodes=0", "error: episodes must be >= 1, got 0"),
        ("--seed=-1", "error: seed must be >= 0, got -1"),
    ],
)
def test_a_setting_out_of_range_is_one_line_and_exit_1(flag, message):
    """--epsilon=7 and --episodes=0 were accepted, exit 0."""
    done = client(flag)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (1, [message], "")


def test_a_usage_error_stays_argparses():
    done = client("--episodes=many")
    assert done.returncode == 2 and "invalid int value: 'many'" in done.stderr


def test_area_weights_worked_example():
    np.testing.assert_array_equal(policy_client.area_weights(3, 2), [[2, 1, 0], [0, 1, 2]])
    np.testing.assert_array_equal(policy_client.area_weights(4, 2), [[2, 2, 0, 0], [0, 0, 2, 2]])
    assert (policy_client.area_weights(210, 84).sum(1) == 210).all()


def exact_area_mean(frame, height, width):
    """The mean of each output pixel's area as a fraction, rounded half up, in Python integers."""
    rows = policy_client.area_weights(frame.shape[0], height).tolist()
    cols = policy_client.area_weights(frame.shape[1], width).tolist()
    total = np.array(rows, object) @ frame.astype(object) @ np.array(cols, object).T
    area = frame.shape[0] * frame.shape[1]
    return ((2 * total + area) // (2 * area)).astype(np.uint8)


@pytest.mark.parametrize("in_shape, out_shape", [((210, 160), (84, 84)), ((250, 160), (84, 84)),
                                                 ((208, 160), (104, 80)), ((7, 5), (3, 2))])  # fmt: skip
def test_client_and_env_resize_to_the_exact_mean_rounded_half_up(in_shape, out_shape):
    """The float32 product rounded by floor(x + 0.5) gave the value below at many exact halves
    (a BLAS's order of sums decides), so no client in another language could match it."""
    frame = np.random.default_rng(0).integers(0, 256, in_shape, dtype=np.uint8)
    expected = exact_area_mean(frame, *out_shape)
    rows = policy_client.area_weights(in_shape[0], out_shape[0])
    cols = policy_client.area_weights(in_shape[1], out_shape[1]).T
    np.testing.assert_array_equal(policy_client.resize(frame, rows, cols), expected)
    resizer = Resizer(in_shape, out_shape)
    np.testing.assert_array_equal(resizer(frame), expected)
    resizer.halves = False  # the general path too
    np.testing.assert_array_equal(resizer(frame), expected)


def test_the_breakout_pixel_of_mean_60_5_is_61():
    """The audit's case: Breakout at 84x84, a pixel whose area's mean is 121 / 2 came out 60."""
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 0)
    ale.loadROM(roms.get_rom_path("breakout"))
    ale.reset_game()
    for step in range(19):
        ale.act(ale_py.Action.FIRE if step % 7 == 0 else ale_py.Action.RIGHT)
    screen = ale.getScreenGrayscale()  # [210, 160]
    total = policy_client.area_weights(210, 84) @ screen.astype(np.int64)
    total = total @ policy_client.area_weights(160, 84).T
    assert total[56, 32] * 2 == 121 * 210 * 160  # the mean is exactly 60.5 there
    rows, cols = policy_client.area_weights(210, 84), policy_client.area_weights(160, 84).T
    assert policy_client.resize(screen, rows, cols)[56, 32] == 61
    assert Resizer((210, 160), (84, 84))(screen)[56, 32] == 61


def test_a_client_drawing_as_the_docs_say_replays_the_games_of_play_games():
    """docs/policy.md, "Replaying tfaccel-eval's games": the ALE seeded with the seed, the no-ops
    from default_rng(seed), the epsilon test and the Gumbel samples from default_rng([seed, 1])
    give the actions and scores `play_games` gave (here with sticky actions and epsilon 0.3)."""
    from tfaccel.envs.atari import AtariConfig

    preprocessing = AtariConfig(game="pong", sticky_action_prob=0.25).describe()
    num_actions, seed, epsilon = len(preprocessing["action_names"]), 7, 0.3

    def policy(observation):  # logits that depend on the frames, so the observations matter
        flat = observation.reshape(-1)[: observation.size // num_actions * num_actions]
        logits = flat.reshape(1, -1, num_actions).mean(axis=1).astype(np.float32)
        return {"action": logits.argmax(-1), "logits": logits}

    seen = []
    records = policy_client.play_games(
        lambda observation: seen.append(observation.copy()) or policy(observation),
        preprocessing, 2, seed=seed, epsilon=epsilon, sample=True, max_agent_steps=150,
    )  # fmt: skip

    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed % (2**31 - 1))
    ale.setFloat("repeat_action_probability", 0.25)
    ale.setInt("frame_skip", 1)
    ale.loadROM(roms.get_rom_path("pong"))
    noops, draws = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    actions = [ale_py.Action[name] for name in preprocessing["action_names"]]
    replayed, scores = [], []
    for _ in range(2):
        ale.reset_game()
        for _ in range(noops.integers(1, preprocessing["noop_max"] + 1)):
            ale.act(ale_py.Action.NOOP)
        stack = np.zeros((104, 80, 4), np.uint8)
        screens = [ale.getScreenGrayscale()] * 2
        score = 0.0
        for _ in range(150):  # no Pong game ends this soon
            frame = np.maximum(*screens)[1:-1]  # one row cropped at the top and the bottom
            small = (frame.reshape(104, 2, 80, 2).astype(np.int32).sum(axis=(1, 3)) + 2) // 4
            stack = np.concatenate([stack[:, :, 1:], small[:, :, None].astype(np.uint8)], -1)
            if draws.random() < epsilon:
                action = int(draws.integers(num_actions))
            else:
                replayed.append(stack)
                logits = policy(stack[None])["logits"][0].astype(np.float64)
                action = int(np.argmax(logits + draws.gumbel(size=num_actions)))
            for i in range(4):
                score += ale.act(actions[action])
                if i >= 2:
                    screens[i - 2] = ale.getScreenGrayscale()
        scores.append(score)
    assert [record.score for record in records] == scores
    assert len(seen) == len(replayed) > 100
    assert all(np.array_equal(a[0], b) for a, b in zip(seen, replayed, strict=True))


def test_a_policy_of_a_game_without_a_rom_names_the_closest_ones():
    """It named the game alone, where tfaccel-train and tfaccel-bench list the close names."""
    preprocessing = policy_client.read_metadata(os.path.join(ROOT, "pretrained", "a2c_pong"))
    with pytest.raises(ValueError, match=r"ships no ROM for 'pongg' .*closest names it has: pong"):
        policy_client.AtariGame(preprocessing["preprocessing"], game="pongg")
