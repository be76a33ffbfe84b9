"""bin/eval on an exported policy: JSON scores, a GIF, sampled actions, and one clear line for
user errors."""

import json
import os
import re
import signal
import subprocess
import sys

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image, ImageSequence

from tests.fakes import as_from_a_terminal
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
        (  # the README's command from a pip install, outside a checkout
            ["--policy_dir=/nonexistent/pretrained/a2c_pong"],
            "error: policy directory /nonexistent/pretrained/a2c_pong does not exist; the "
            "pretrained policies come with a checkout of tfaccel's repository, not with a pip "
            "install: give the path of its pretrained/ folder",
        ),
        (["--policy_dir=/nonexistent", "--episodes=0"], "error: episodes must be >= 1, got 0"),
        (["--policy_dir=/nonexistent", "--epsilon=2"], "error: epsilon must be in [0, 1], got 2"),
        (
            ["--policy_dir=/nonexistent", "--mp4=/nonexistent/a.mp4"],
            "error: cannot write mp4=/nonexistent/a.mp4: the directory /nonexistent does not exist",
        ),
        (  # it was ignored without a word
            ["--policy_dir=pretrained/a2c_pong", "--gif_every=2"],
            "error: --gif_every sets the frames of a GIF: give --gif=FILE.gif with it",
        ),
        (
            ["--policy_dir=pretrained/a2c_pong", "--gif=/nonexistent/a.gif"],
            "error: cannot write gif=/nonexistent/a.gif: the directory /nonexistent does not exist",
        ),
    ],
)
def test_user_errors_end_with_one_line(args, message):
    result = run(*args)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.strip().startswith(message), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("gif", "out", "gif must be a file name ending in .gif, got '{tmp}/out'"),
        ("gif", "out.png", "gif must be a file name ending in .gif, got '{tmp}/out.png'"),
        ("gif", "", "gif must be a file name ending in .gif, got '{tmp}/', which is a directory"),
        ("gif", "sub", "gif must be a file name ending in .gif, got '{tmp}/sub', which is a directory"),
        ("mp4", "out.gif", "mp4 must be a file name ending in .mp4, got '{tmp}/out.gif'"),
        ("mp4", "out.mp4/", "mp4 must be a file name ending in .mp4, got '{tmp}/out.mp4/', which is a directory"),
    ],
    ids=["no_ending", "png", "slash", "directory", "gif_as_mp4", "mp4_slash"],
)  # fmt: skip
def test_a_video_path_that_cannot_be_written_is_refused_before_any_game(
    tmp_path, flag, value, message
):
    """--gif=out played every game, then failed on the extension; --gif=out.png wrote a PNG;
    --mp4=out.gif ended with a broken pipe and a 0-byte file."""
    (tmp_path / "sub").mkdir()
    result = run(
        "--policy_dir=pretrained/a2c_pong", "--episodes=1", "--max_agent_steps=5",
        f"--{flag}={tmp_path}/{value}",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.splitlines() == [f"error: {message.format(tmp=tmp_path)}"]
    assert result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["sub"] and os.listdir(tmp_path / "sub") == []


def test_a_video_in_a_directory_that_refuses_files_is_refused_before_any_game():
    """--gif into a folder without write permission played every game, then failed naming a
    temporary file. /proc refuses new files even to root, as a read-only mount would."""
    result = run(
        "--policy_dir=pretrained/a2c_pong", "--episodes=1", "--max_agent_steps=5",
        "--gif=/proc/game.gif",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        "error: cannot write gif=/proc/game.gif: the directory /proc takes no new file (No such "
        "file or directory); give a path in a directory you can write to"
    ]
    assert result.stdout == ""


class FailingFrames(list):
    """Video frames whose iteration fails after 3 frames, as a full disk would mid-write."""

    def __iter__(self):
        for index, frame in enumerate(list.__iter__(self)):
            if index == 3:
                raise OSError(28, "No space left on device")
            yield frame


def test_a_video_that_fails_midway_leaves_no_partial_file_and_the_old_one_as_it_was(
    tmp_path, monkeypatch
):
    frames = FailingFrames(np.full((210, 160, 3), value, np.uint8) for value in range(0, 200, 20))
    mp4 = tmp_path / "game.mp4"
    mp4.write_bytes(b"the previous video")
    with pytest.raises(OSError, match="No space left"):
        evaluate.write_mp4(frames, str(mp4), fps=15.0)
    assert sorted(os.listdir(tmp_path)) == ["game.mp4"]
    assert mp4.read_bytes() == b"the previous video"

    def save_half_then_fail(image, path, *args, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"GIF89a")  # a header, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", save_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        evaluate.write_gif(list(frames), str(tmp_path / "game.gif"), frame_ms=270)
    assert sorted(os.listdir(tmp_path)) == ["game.mp4"]


@pytest.mark.parametrize("stop, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_prints_the_finished_games_and_one_line_then_exits_130_or_143(
    pong_policy, tmp_path, stop, status
):
    """A Ctrl-C mid-game printed a traceback; a SIGTERM ended the command without a word and
    without the JSON of the games that had ended."""
    gif = tmp_path / "game.gif"
    process = subprocess.Popen(
        [sys.executable, "bin/eval", f"--policy_dir={pong_policy}", "--episodes=500",
         "--max_agent_steps=20", f"--gif={gif}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        start_new_session=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        # Unbuffered: readline takes this line alone, and communicate() the rest (a buffered
        # readline could take the next games' lines too, where communicate() never sees them).
        first = process.stderr.readline().decode()  # the first game has ended
        assert first.startswith("game 1/500: "), first
        os.killpg(process.pid, getattr(signal, stop))  # as a terminal's Ctrl-C: the group
        stdout, stderr = (text.decode() for text in process.communicate(timeout=60))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == status, stderr[-2000:]
    assert "Traceback" not in stderr
    lines = (first + stderr).strip().splitlines()
    assert all(line.startswith("game ") for line in lines[:-1]), lines
    stopped = re.fullmatch(rf"stopped by {stop} after (\d+) of 500 games", lines[-1])
    assert stopped, lines[-1]
    data = json.loads(stdout)  # the games that ended (the last maybe not yet printed)
    assert data["episodes"] == int(stopped.group(1)) in (len(lines) - 1, len(lines))
    assert data["stopped_by"] == stop and data["lengths"] == [20] * data["episodes"]
    assert not gif.exists() and os.listdir(tmp_path) == []  # no video of an unfinished run
    with pytest.raises(ProcessLookupError):  # nothing of the command is left running
        os.killpg(process.pid, 0)


def test_ctrl_c_before_any_game_ended_prints_no_json(pong_policy, monkeypatch, capsys):
    from tfaccel.commands import eval as eval_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(policy_client, "play_games", interrupted)
    try:
        eval_command.main([f"--policy_dir={pong_policy}", "--episodes=3"])
    except SystemExit as stop:
        assert stop.code == 130
    except KeyboardInterrupt:  # not re-raised: it would stop the test session
        pytest.fail("the Ctrl-C reached the user as a traceback")
    else:
        pytest.fail("no exit status after a Ctrl-C")
    out, err = capsys.readouterr()
    assert out == "" and err == "stopped by SIGINT after 0 of 3 games\n"
    with pytest.raises(evaluate.Interrupted) as caught:  # still a KeyboardInterrupt for notebooks
        evaluate.evaluate(pong_policy, 3)
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.result is None


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
    assert "needs FIRE to start, played greedily?), or the limit is shorter" in stuck.stderr
    default = run(f"--policy_dir={path}", "--episodes=1", "--max_agent_steps=20")
    assert json.loads(default.stdout)["epsilon"] == 0.001  # Machado et al.'s evaluation
    # It said "played greedily with epsilon 0?" of games played at ε = 0.001.
    assert "epsilon 0" not in json.loads(default.stdout)["warning"]
    sampled = run(f"--policy_dir={path}", "--episodes=1", "--max_agent_steps=20", "--sample")
    assert "FIRE" not in json.loads(sampled.stdout)["warning"]  # not greedy: no such guess


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
