"""The Atari env against a plain, slow reference on real ALE frames."""

import re
import subprocess
import sys

import ale_py
import numpy as np
import pytest
from ale_py import roms

from tfaccel.envs.atari import AtariConfig, canonical_game, game_names
from tfaccel.envs.frames import FrameStack, Resizer, area_matrix, area_weights, taps


def test_game_names_accept_snake_and_camel_case():
    assert canonical_game("pong") == "pong"
    assert canonical_game("Pong") == "pong"
    assert canonical_game("SpaceInvaders") == "space_invaders"
    assert canonical_game("space-invaders") == "space_invaders"
    assert "breakout" in game_names()


def test_unknown_game_lists_close_names():
    with pytest.raises(ValueError, match=r"unknown Atari game 'pongg'.*closest valid names: pong"):
        AtariConfig(game="pongg")


def test_a_gymnasium_id_names_the_game_and_the_settings_it_stands_for():
    for gym_id, game in [("PongNoFrameskip-v4", "pong"), ("ALE/SpaceInvaders-v5", "space_invaders"),
                         ("BreakoutDeterministic-v4", "breakout")]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"'{gym_id}' is a Gymnasium id; AtariConfig.game "
                           rf"takes the game's name, '{game}' \(frame skip and sticky"):  # fmt: skip
            canonical_game(gym_id)
    with pytest.raises(ValueError, match="unknown Atari game 'Nope-v4'"):
        canonical_game("Nope-v4")


def test_area_matrix_worked_examples():
    np.testing.assert_allclose(area_matrix(4, 2), [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    np.testing.assert_allclose(area_matrix(3, 2), [[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]], rtol=1e-6)


def test_halving_fast_path_equals_area_matrices():
    frame = np.random.default_rng(0).integers(0, 256, (208, 160), dtype=np.uint8)
    fast = Resizer((208, 160), (104, 80))
    assert fast.halves
    blocks = frame.reshape(104, 2, 80, 2).astype(np.float64).mean(axis=(1, 3))
    expected = np.floor(blocks + 0.5).astype(np.uint8)  # round halves up
    np.testing.assert_array_equal(fast(frame), expected)
    general = Resizer((208, 160), (104, 80))
    general.halves = False
    np.testing.assert_array_equal(general(frame), expected)


def test_taps_worked_example_and_the_resize_equals_the_weight_matrices():
    cells, weights = taps(area_weights(3, 2))
    np.testing.assert_array_equal(cells, [[0, 1], [1, 2]])
    np.testing.assert_array_equal(weights, [[2, 1], [1, 2]])
    rng = np.random.default_rng(1)
    for in_shape, out_shape in (((210, 160), (84, 84)), ((250, 160), (84, 84)), ((9, 7), (4, 3))):
        frame = rng.integers(0, 256, in_shape, dtype=np.uint8)
        rows, cols = (area_weights(n, m) for n, m in zip(in_shape, out_shape, strict=True))
        sums = rows @ frame.astype(np.int64) @ cols.T  # the same integers, by matrices
        area = in_shape[0] * in_shape[1]
        expected = (2 * sums + area) // (2 * area)
        np.testing.assert_array_equal(Resizer(in_shape, out_shape)(frame), expected)


@pytest.mark.parametrize("depth", [4, 3])
def test_frame_stack_is_oldest_first_with_zeros_at_start(depth):
    stack = FrameStack(2, 3, depth)
    for value in (1, 2):
        out = stack.push(np.full((2, 3), value, np.uint8))
    expected = [0] * (depth - 2) + [1, 2]
    np.testing.assert_array_equal(out[1, 2], expected)
    stack.clear()
    np.testing.assert_array_equal(
        stack.push(np.full((2, 3), 9, np.uint8))[0, 0], [0] * (depth - 1) + [9]
    )


class ReferenceAtari:
    """The paper's preprocessing written plainly: one frame at a time, no buffers reused."""

    def __init__(self, seed, sticky=0.0):
        self.ale = ale_py.ALEInterface()
        self.ale.setInt("random_seed", seed)
        self.ale.setFloat("repeat_action_probability", sticky)
        self.ale.loadROM(roms.get_rom_path("pong"))
        self.actions = self.ale.getMinimalActionSet()
        self.frames = []

    def observe(self, screens):
        pooled = np.maximum(screens[-2], screens[-1]).astype(np.float64)[1:209]
        small = np.floor(pooled.reshape(104, 2, 80, 2).mean(axis=(1, 3)) + 0.5).astype(np.uint8)
        self.frames.append(small)
        recent = self.frames[-4:]
        padded = [np.zeros_like(small)] * (4 - len(recent)) + recent
        return np.stack(padded, axis=-1)

    def reset(self, noops):
        self.ale.reset_game()
        for _ in range(noops):
            self.ale.act(ale_py.Action.NOOP)
        self.frames = []
        screen = self.ale.getScreenGrayscale()
        return self.observe([screen, screen])

    def step(self, action):
        screens, reward = [], 0.0
        for _ in range(4):
            reward += self.ale.act(self.actions[action])
            screens.append(self.ale.getScreenGrayscale())
        return self.observe(screens), reward


def test_preprocessing_matches_plain_reference_on_real_frames():
    seed = 7
    config = AtariConfig(game="pong", clip_rewards=False)
    env = config(seed)
    noops = int(np.random.default_rng(seed).integers(1, config.noop_max + 1))
    reference = ReferenceAtari(seed)
    np.testing.assert_array_equal(env.reset(), reference.reset(noops))
    rng = np.random.default_rng(1)
    rewards = []
    for _ in range(300):
        action = int(rng.integers(env.spec.num_actions))
        result = env.step(action)
        expected, reward = reference.step(action)
        np.testing.assert_array_equal(result.observation, expected)
        assert result.reward == reward
        rewards.append(reward)
    assert any(rewards), "300 random steps of Pong should score at least one point"
    assert result.observation.std() > 0


@pytest.mark.parametrize("game, rows", [("adventure", 250), ("air_raid", 250), ("carnival", 214)])
def test_games_with_taller_screens_are_cropped_and_resized_from_their_own(game, rows):
    env = AtariConfig(game=game)(0)
    assert env.screen_shape == (rows, 160)
    assert AtariConfig(game=game).describe()["screen"] == [rows, 160]
    first = env.reset().copy()
    assert first.shape == (104, 80, 4) and first[..., -1].any()
    # The last frame of the stack is the area resize of the whole cropped screen (rows 1 ..
    # rows - 2), not of its first 208 rows.
    screen = env._ale.getScreenGrayscale()[1 : rows - 1]
    expected = Resizer(screen.shape, (104, 80))(screen)
    np.testing.assert_array_equal(first[..., -1], expected)
    for t in range(50):
        env.step(t % env.spec.num_actions)


def test_a_game_whose_rom_ale_would_exit_on_is_refused_with_one_line():
    # ALE ends the whole process (exit 1, no exception) on a ROM it does not recognize: the
    # name is refused before any emulator starts, in this process and in a pool's workers.
    with pytest.raises(ValueError, match="'combat' that ALE does not recognize"):
        AtariConfig(game="Combat")
    assert "combat" not in game_names() and "pong" in game_names()


def test_every_game_it_lists_loads():
    # In a child process: a game that ALE refused would end it, not raise.
    script = (
        "import ale_py\n"
        "from ale_py import roms\n"
        "from tfaccel.envs.atari import game_names\n"
        "ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)\n"
        "for game in game_names():\n"
        "    ale = ale_py.ALEInterface()\n"
        "    ale.loadROM(roms.get_rom_path(game))\n"
        "print(len(game_names()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split()[-1]) == len(game_names()) > 50


@pytest.mark.full  # ~1 minute: make test-all
def test_every_game_plays_with_the_default_preprocessing():
    rng = np.random.default_rng(0)
    for game in game_names():
        env = AtariConfig(game=game, noop_max=3)(0)
        observation = env.reset()
        for _ in range(60):
            result = env.step(int(rng.integers(env.spec.num_actions)))
            observation = result.observation
            if result.terminated or result.truncated:
                observation = env.reset()
        assert observation.shape == (104, 80, 4) and observation.dtype == np.uint8, game
        env.close()


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(crop_top=-1), "AtariConfig.crop_top and crop_bottom must be 0 or more and leave "
                            "some of the 210 rows, got -1 and 1"),
        (dict(crop_top=200, crop_bottom=10), "got 200 and 10"),
        (dict(sticky_action_prob=1.5), "AtariConfig.sticky_action_prob must be between 0 and 1"),
        (dict(noop_max=-1), "AtariConfig.noop_max must be at least 0, got -1"),
        (dict(frame_skip=1), "AtariConfig.frame_skip must be 2 or more, got 1"),
    ],
)  # fmt: skip
def test_settings_out_of_range_name_their_binding(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AtariConfig(**settings)


def test_a_crop_that_leaves_too_few_rows_of_the_games_screen_is_named():
    with pytest.raises(ValueError, match=r"carnival's screen is 214x160: cropped by 100 \+ 100"):
        AtariConfig(game="carnival", crop_top=100, crop_bottom=100)(0)


def test_same_seed_same_trajectory_and_different_seed_differs():
    def run(seed):
        env = AtariConfig(game="breakout", sticky_action_prob=0.25)(seed)
        frames = [env.reset().copy()]
        for t in range(200):
            result = env.step(t % env.spec.num_actions)
            frames.append(result.observation.copy())
            if result.terminated:
                frames.append(env.reset().copy())
        return np.stack(frames)

    np.testing.assert_array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))


def test_episodic_life_ends_learning_episode_not_game():
    env = AtariConfig(game="breakout", fire_on_reset=True, noop_max=0, clip_rewards=False)(0)
    env.reset()
    rng = np.random.default_rng(0)
    life_ends, raw = 0, 0.0
    while True:
        result = env.step(int(rng.integers(env.spec.num_actions)))  # the ball is soon lost
        raw += result.reward
        if result.terminated:
            life_ends += 1
            if env.game.over:
                break
            assert env.game.length > 0
            env.reset()
    assert life_ends == 5  # Breakout has five lives
    assert env.game.over and env.game.score == raw > 0  # the game's score spans all its lives


def test_clipped_rewards_keep_raw_score():
    env = AtariConfig(game="pong", noop_max=0, max_agent_steps=400)(0)
    env.reset()
    clipped = 0.0
    while True:
        result = env.step(0)
        clipped += result.reward
        assert result.reward in (-1.0, 0.0, 1.0)
        if result.terminated or result.truncated:
            break
    assert result.truncated and not result.terminated  # Pong has no lives: only the time limit
    assert env.game.over and env.game.length == 400
    assert env.game.score == clipped  # Pong points are +-1, so clipping keeps them
    assert env.game.score < 0


def test_truncation_at_time_limit_then_new_game():
    env = AtariConfig(game="pong", max_agent_steps=5)(0)
    env.reset()
    flags = [env.step(0)[2:] for _ in range(5)]
    assert flags[:4] == [(False, False)] * 4 and flags[4] == (False, True)
    env.reset()
    assert env.game.length == 0 and not env.game.over


def test_nature_preprocessing_shape_and_full_action_set():
    env = AtariConfig.nature(game="Pong", full_action_set=True)(0)
    assert env.spec.observation.shape == (84, 84, 4)
    assert env.spec.num_actions == 18
    assert env.reset()[..., -1].std() > 0


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(frame_skip=0), "frame_skip must be positive"),
        (dict(height=-1), "height must be positive"),
        (dict(sticky_action_prob=1.5), "sticky_action_prob"),
        (dict(frame_skip=1), "max_pool"),
    ],
)
def test_bad_settings_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        AtariConfig(**bad)


def test_a_reset_in_the_middle_of_an_episode_starts_a_new_game():
    env = AtariConfig(game="breakout", noop_max=0, clip_rewards=False)(0)
    env.reset()
    for _ in range(30):
        env.step(0)
    assert env.game.length == 30 and not env.game.over
    fresh = env.reset().copy()  # a caller's reset (tf-agents' reset, a second pool.reset())
    assert env.game.length == 0 and env.game.score == 0.0 and not env.game.over
    assert env._ale.lives() == 5  # a new game, not the old one's frames with a cleared stack
    np.testing.assert_array_equal(fresh, AtariConfig(game="breakout", noop_max=0)(0).reset())


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(frame_skip="4"), "AtariConfig.frame_skip must be an int, got '4' (str)"),
        (dict(max_pool=1), "AtariConfig.max_pool must be True or False, got 1 (int)"),
        (dict(noop_max=True), "AtariConfig.noop_max must be an int, got True (bool)"),
        (dict(game=5), "AtariConfig.game must be a string, got 5 (int)"),
    ],
)
def test_a_setting_of_the_wrong_type_is_named(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AtariConfig(**bad)
    assert AtariConfig(sticky_action_prob=0).sticky_action_prob == 0  # an int is a number
