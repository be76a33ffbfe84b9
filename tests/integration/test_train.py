"""bin/train end to end: artifacts, resume, Ctrl-C, learning on Catch, and user errors."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = ["--gin_file=a2c.gin", "--gin_file=smoke.gin"]


def train(root_dir, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "bin/train", f"--root_dir={root_dir}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def rows(root_dir):
    with open(os.path.join(root_dir, "metrics.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def test_smoke_run_writes_every_artifact(tmp_path):
    result = train(tmp_path, *SMOKE, "--gin_bindings=train.eval_episodes = 1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2,000 frames" in result.stdout
    table = rows(tmp_path)
    for column in (
        "env_frames",
        "agent_steps",
        "wall_s",
        "fps",
        "episode_return_raw_mean",
        "episodes",
    ):
        assert column in table[0]
    frames = [int(row["env_frames"]) for row in table]
    assert frames == sorted(frames) and frames[-1] == 2000
    assert all(int(row["env_frames"]) == 4 * int(row["agent_steps"]) for row in table)
    config = (tmp_path / "operative_config.gin").read_text()
    assert "train.total_frames = 2000" in config and "AtariConfig.game = 'pong'" in config
    assert (tmp_path / "checkpoints" / "checkpoint").exists()
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "tb"))
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["preprocessing"]["game"] == "pong" and metadata["extra"]["env_frames"] == 2000
    evaluations = list(csv.DictReader(open(tmp_path / "eval.csv", newline="")))
    assert [int(row["env_frames"]) for row in evaluations][-1] == 2000
    assert float(evaluations[-1]["eval_return_mean"]) <= -15  # an untrained Pong policy loses


def test_same_command_resumes_counters_and_csv(tmp_path):
    first = train(tmp_path, *SMOKE, "--gin_bindings=train.total_frames = 1000")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(tmp_path, *SMOKE)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    table = rows(tmp_path)
    frames = [int(row["env_frames"]) for row in table]
    assert frames == sorted(frames) and frames[0] < 1200 < 2000 <= frames[-1] < 2100
    wall = [float(row["wall_s"]) for row in table]
    assert wall == sorted(wall)  # wall time continues too
    assert open(tmp_path / "metrics.csv").read().count("env_frames") == 1  # one header
    again = train(tmp_path, *SMOKE)  # nothing left to do: says so and trains no further
    assert again.returncode == 0 and "the run is complete" in again.stdout
    assert len(rows(tmp_path)) == len(table)


def test_sigint_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE,
         "--gin_bindings=train.total_frames = 10_000_000", "--gin_bindings=train.log_interval_frames = 400"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (tmp_path / "metrics.csv").exists():
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    assert "stopped by SIGINT" in out
    stopped_at = int(rows(tmp_path)[-1]["env_frames"])
    assert 0 < stopped_at < 10_000_000
    resumed = train(tmp_path, *SMOKE, f"--gin_bindings=train.total_frames = {stopped_at + 800}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at {stopped_at:,} frames" in resumed.stdout
    assert int(rows(tmp_path)[-1]["env_frames"]) >= stopped_at + 800


@pytest.mark.parametrize("config", ["catch_a2c.gin", "catch_ppo.gin"])
def test_learns_catch_in_seconds(tmp_path, config):
    result = train(tmp_path, f"--gin_file={config}")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(row["episode_return_raw_mean"]) for row in rows(tmp_path)]
    assert scores[0] < 0.2  # a random paddle misses most balls (mean about -0.6)
    assert max(scores[-3:]) >= 0.6, scores


@pytest.mark.parametrize(
    "config, columns",
    [("ppo.gin", {"approx_kl", "clip_fraction"}), ("a2c_256.gin", {"policy_loss", "entropy"})],
)
def test_every_config_runs_with_smoke(tmp_path, config, columns):
    bindings = ["--gin_bindings=train.horizon = 16"] if config == "ppo.gin" else []
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin", *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert int(table[-1]["env_frames"]) >= 2000
    assert columns <= set(table[-1])
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    # The learning rate falls linearly with the frames done, however many SGD steps an update
    # takes (PPO: epochs x minibatches); one rollout of frames may still be ahead of the row.
    initial = {"ppo.gin": 2.5e-4, "a2c_256.gin": 1.4e-3}[config]
    for row in table:
        remaining = 1 - int(row["env_frames"]) / 2000
        assert float(row["learning_rate"]) == pytest.approx(initial * remaining, abs=0.25 * initial)
    assert float(table[0]["learning_rate"]) > 0.5 * initial


def test_off_policy_run_trains_from_replay_exports_and_resumes(tmp_path):
    # Not yet a learning test: DQN on Catch improves (about -0.4 to +0.5 in 24k steps) but does
    # not solve it reliably in seconds; this checks the machinery end to end.
    bindings = ["--gin_bindings=train_off_policy.total_frames = 3000",
                "--gin_bindings=train_off_policy.checkpoint_interval_frames = 1500"]  # fmt: skip
    result = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert {"loss", "q_mean", "replay_size", "epsilon"} <= set(table[-1])
    assert float(table[-1]["epsilon"]) < 1.0 and int(table[-1]["replay_size"]) > 1000
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["head"] == "q_values" and metadata["num_actions"] == 3
    resumed = train(tmp_path, "--gin_file=catch_dqn.gin", bindings[0].replace("3000", "4000"))
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-3000:]
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 4000


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gin_bindings=train.no_such_setting = 1"], "bad gin config"),
        (
            ["--gin_bindings=AtariConfig.game = 'pongg'"],
            "unknown Atari game 'pongg'; closest valid names: pong",
        ),
        (
            ["--gin_file=no_such.gin"],
            "gin file 'no_such.gin' not found; configs in gin_configs/: a2c.gin",
        ),
        (["--gin_bindings=train.num_groups = 3"], "num_groups must be 1 or 2, got 3"),
    ],
)
def test_user_errors_end_with_one_line(tmp_path, args, message):
    result = train(tmp_path, *SMOKE, *args, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
