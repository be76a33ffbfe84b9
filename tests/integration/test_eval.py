"""bin/eval on an exported policy: JSON scores, a GIF, sampled actions, and one clear line for
user errors."""

import json
import os
import subprocess
import sys

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image, ImageSequence

from tfaccel import evaluate, export, policy_client
from tfaccel.envs.atari import AtariConfig
from tfaccel.networks import PolicyValueNetwork, QNetwork, a3c_torso

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "bin/eval", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def pong_policy(tmp_path_factory):
    config = AtariConfig(game="pong")
    path = str(tmp_path_factory.mktemp("run") / "policy")
    export.export_policy(PolicyValueNetwork(config(0).spec), config, path)
    return path


def test_eval_prints_scores_and_writes_gif_and_mp4(pong_policy, tmp_path):
    gif, mp4 = tmp_path / "game.gif", tmp_path / "game.mp4"
    result = run(
        f"--policy_dir={pong_policy}", "--episodes=1", "--max_agent_steps=200", f"--gif={gif}",
        f"--mp4={mp4}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # Each game as it ends, and nothing of TensorFlow's C++ start-up (CUDA probes, oneDNN).
    lines = result.stderr.splitlines()
    assert lines[0].startswith("game 1/1: ") and lines[0].endswith(" in 200 agent steps")
    assert all(line.startswith("warning: ") for line in lines[1:]), result.stderr  # step limit
    data = json.loads(result.stdout)
    assert data["episodes"] == 1 and len(data["scores"]) == 1
    assert data["lengths"] == [200]  # an untrained Pong player loses no game in 200 steps
    assert data["mean"] == data["min"] == data["max"] == data["scores"][0] <= 0
    assert data["std"] == 0.0 and data["policy_dir"] == pong_policy and data["game"] == "pong"
    expected_frames = 1 + 200 // 4  # the start, then every 4th agent step
    assert data["gif"]["frames"] == expected_frames
    with Image.open(gif) as image:
        assert image.size == (160, 210) and image.n_frames > 1
        durations = [frame.info["duration"] for frame in ImageSequence.Iterator(image)]
    # Pillow merges identical consecutive frames into one longer frame: count in time.
    assert sum(durations) == expected_frames * data["gif"]["frame_ms"]
    assert data["mp4"] == dict(path=str(mp4), frames=1 + 200, fps=15.0)  # every step, real time
    reader = imageio_ffmpeg.read_frames(str(mp4))
    meta = next(reader)
    assert meta["size"] == (320, 420) and meta["fps"] == 15.0
    assert sum(1 for _ in reader) == 1 + 200


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy_dir=/nonexistent"], "error: policy directory /nonexistent does not exist"),
        (["--policy_dir=tests"], "error: tests is not a tfaccel policy: it has no tfaccel_policy"),
        (["--policy_dir=/nonexistent", "--episodes=0"], "error: episodes must be >= 1, got 0"),
        (["--policy_dir=/nonexistent", "--epsilon=2"], "error: epsilon must be in [0, 1], got 2"),
        (
            ["--policy_dir=/nonexistent", "--mp4=/nonexistent/a.mp4"],
            "error: cannot write the MP4 /nonexistent/a.mp4: its directory does not exist",
        ),
        (
            ["--policy_dir=pretrained/a2c_pong", "--gif=/nonexistent/a.gif"],
            "error: cannot write the GIF /nonexistent/a.gif: its directory does not exist",
        ),
    ],
)
def test_user_errors_end_with_one_line(args, message):
    result = run(*args)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.strip().startswith(message), result.stderr
    assert result.stdout == ""


def test_sample_action_follows_the_softmax():
    rng = np.random.default_rng(0)
    logits = np.log([1.0, 3.0, 6.0])  # softmax: 0.1, 0.3, 0.6
    draws = np.array([policy_client.sample_action(logits, rng) for _ in range(20_000)])
    frequencies = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(frequencies, [0.1, 0.3, 0.6], atol=0.015)  # > 4 sigma
    assert policy_client.sample_action(np.array([0.0, 50.0, 0.0]), rng) == 1


def test_games_played_with_samples_take_other_actions_than_greedy(monkeypatch):
    taken = []
    step = policy_client.AtariGame.step
    monkeypatch.setattr(
        policy_client.AtariGame, "step", lambda game, action: (taken.append(action), step(game, action))[1]
    )  # fmt: skip
    logits = np.log([[1.0, 1.0, 1.0, 1.0, 2.0, 4.0]])  # [1, 6]: the greedy action is 5
    policy = lambda observation: {"action": np.array([5]), "logits": logits}  # noqa: E731
    preprocessing = AtariConfig(game="pong").describe()
    played = {}
    for sample in (False, True):
        taken.clear()
        policy_client.play_games(policy, preprocessing, 1, sample=sample, max_agent_steps=400)
        played[sample] = np.bincount(taken, minlength=6) / len(taken)
    assert played[False][5] == 1.0
    np.testing.assert_allclose(played[True], np.exp(logits[0]) / 10, atol=0.1)  # 400 draws


def test_eval_samples_a_policy_gradient_policy_and_refuses_a_q_policy(pong_policy, tmp_path):
    result = run(f"--policy_dir={pong_policy}", "--episodes=1", "--max_agent_steps=50", "--sample")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["actions"] == "sampled"
    config = AtariConfig(game="pong")
    q_policy = str(tmp_path / "q_policy")
    export.export_policy(
        QNetwork(config(0).spec, torso=a3c_torso), config, q_policy, head="q_values"
    )
    result = run(f"--policy_dir={q_policy}", "--episodes=1", "--sample")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().startswith("error: sampling needs a policy-gradient policy")


def test_eval_plays_by_the_policys_own_settings_unless_told_otherwise(tmp_path):
    config = AtariConfig(game="pong", max_agent_steps=60, noop_max=0)
    path = str(tmp_path / "policy")
    export.export_policy(PolicyValueNetwork(config(0).spec), config, path)
    assert evaluate.evaluate(path, 1)["lengths"] == [60]  # its training env's limit
    assert evaluate.evaluate(path, 1, max_agent_steps=30)["lengths"] == [30]


def test_a_policy_stuck_before_fire_is_warned_about_and_eval_explores_by_default(tmp_path):
    """Greedy play with epsilon 0 of a policy that never presses FIRE waited out the step limit
    on Breakout in silence (a score of 0 after 27,000 steps)."""
    config = AtariConfig(game="breakout")
    network = PolicyValueNetwork(config(0).spec)
    kernel, bias = network.policy_head.get_weights()
    network.policy_head.set_weights([np.zeros_like(kernel), np.eye(len(bias))[0] * 10])  # NOOP
    path = str(tmp_path / "policy")
    export.export_policy(network, config, path)
    stuck = run(f"--policy_dir={path}", "--episodes=1", "--max_agent_steps=300", "--epsilon=0")
    assert stuck.returncode == 0, stuck.stderr[-3000:]
    data = json.loads(stuck.stdout)
    assert data["lengths"] == [300] and data["at_step_limit"] == 1 and data["scores"] == [0.0]
    assert "warning: 1 of 1 games ran to the step limit (300 agent steps)" in stuck.stderr
    assert "game 1/1: 0 in 300 agent steps" in stuck.stderr  # each game as it ends
    default = run(f"--policy_dir={path}", "--episodes=1", "--max_agent_steps=20")
    assert json.loads(default.stdout)["epsilon"] == 0.001  # Machado et al.'s evaluation


# The shipped policies and the least each must score in one game: the lowest of the 10 games
# each played when it was committed (A2C 20.9 +- 0.3, min 20; C51 11.6 +- 5.6, min 4), less 2.
SHIPPED = {"a2c_pong": 18, "c51_pong": 2}


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_pong_policies_win_out_of_the_box(name):
    """pretrained/*, as a user plays them: the current preprocessing and export format still fit
    the policies committed to the repository (a change to either would lose games)."""
    result = run(f"--policy_dir=pretrained/{name}", "--episodes=1", "--seed=1")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["game"] == "pong" and data["at_step_limit"] == 0
    assert data["scores"][0] >= SHIPPED[name], data
