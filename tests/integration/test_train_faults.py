"""bin/train struck while it runs: stop signals, kills (also while saving), a full disk, env
workers that fail, non-finite losses, and a stop while it starts."""

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests import shm
from tests.fakes import as_from_a_terminal
from tests.integration.commands import ROOT, SMOKE, logged_frames, rows, train
from tfaccel.bench.memory import descendants, state
from tfaccel.envs.pool import env_seeds


@pytest.mark.parametrize("name, group", [("SIGINT", False), ("SIGTERM", True)])
def test_a_stop_signal_saves_a_checkpoint_and_the_run_resumes(tmp_path, name, group):
    # SIGTERM to the whole process group, as a job scheduler stops a job: the env workers (4,
    # none may be replaced) ignore it and the trainer stops them.
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE,
         "--gin_bindings=RunConfig.total_frames = 10_000_000", "--gin_bindings=RunConfig.log_interval_frames = 400",
         "--gin_bindings=PoolConfig.num_workers = 4", "--gin_bindings=PoolConfig.envs_per_worker = 2",
         "--gin_bindings=PoolConfig.max_restarts = 0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (tmp_path / "metrics.csv").exists():
        time.sleep(0.2)
    time.sleep(1.0)
    workers = descendants(process.pid)
    number = getattr(signal, name)
    os.killpg(process.pid, number) if group else process.send_signal(number)
    out, err = process.communicate(timeout=60)
    # 128 + the signal's number, as a shell reports it: `train && eval` stops here.
    assert process.returncode == {"SIGINT": 130, "SIGTERM": 143}[name], err[-3000:]
    assert f"stopped by {name}" in out and "Traceback" not in err, err[-3000:]
    assert "so far: " in out and "done: " not in out  # a stopped run is not done
    deadline = time.monotonic() + 30  # the forkserver and workers may still be on their way out
    while any(state(pid) not in ("", "Z") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if state(pid) not in ("", "Z")], "processes left"
    stopped_at = int(rows(tmp_path)[-1]["env_frames"])
    assert 0 < stopped_at < 10_000_000
    resumed = train(tmp_path, *SMOKE, f"--gin_bindings=RunConfig.total_frames = {stopped_at + 800}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at {stopped_at:,} frames" in resumed.stdout
    assert int(rows(tmp_path)[-1]["env_frames"]) >= stopped_at + 800


def test_a_killed_trainer_resumes_from_its_last_checkpoint_and_logs_each_frame_once(tmp_path):
    # Rows every 1,000 frames (at the end of a rollout: 1,032, 2,072, ...), checkpoints every
    # 1,200: a checkpoint falls between rows, as it does in the presets.
    intervals = ["--gin_bindings=RunConfig.log_interval_frames = 1_000"]
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE, *intervals,
         "--gin_bindings=RunConfig.total_frames = 10_000_000",
         "--gin_bindings=RunConfig.checkpoint_interval_frames = 1_200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while logged_frames(tmp_path) < 3000:
        assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
        time.sleep(0.2)
    workers = descendants(process.pid)
    process.kill()  # SIGKILL: no handler runs, no checkpoint is written
    process.communicate(timeout=30)
    logged = int(rows(tmp_path)[-1]["env_frames"])
    deadline = time.monotonic() + 15  # the workers exit once the trainer is gone
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
    assert not shm.left_by(process.pid, *workers)

    # The newest checkpoint in the list, which is written after the checkpoint's own files.
    state = tf.train.get_checkpoint_state(str(tmp_path / "checkpoints"))
    saved = int(state.model_checkpoint_path.rsplit("ckpt-", 1)[1])
    assert 1200 <= saved <= logged
    resumed = train(
        tmp_path, *SMOKE, *intervals, f"--gin_bindings=RunConfig.total_frames = {logged + 2000}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at {saved:,} frames" in resumed.stdout  # lost: only the work since the checkpoint
    frames = [int(row["env_frames"]) for row in rows(tmp_path)]
    assert frames == sorted(set(frames)) and frames[-1] >= logged + 2000  # each frame count once
    # No stretch without a row: the resumed run logged its first row one interval after the last
    # row kept, not after the checkpoint (a gap of up to two intervals, every crash).
    assert max(b - a for a, b in zip(frames[:-1], frames[1:], strict=True)) <= 1_100, frames
    assert not [name for name in os.listdir(tmp_path / "checkpoints") if "_temp" in name]


# Runs bin/train with a SIGKILL planted in the second write of a checkpoint or of the replay:
# TensorFlow's merge of the written shards into ckpt-<n> (its _temp folder is then on disk, its
# index not), or the replay file, cut in half.
KILLED_IN_SAVE = """
import os, signal, sys
import numpy as np
from tensorflow.python.ops import gen_io_ops
from tfaccel.commands import train

def second_call_killed(original, is_ours, cut):
    calls = []
    def wrapper(*args, **kwargs):
        if is_ours(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                cut(original, *args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    return wrapper

def half_written(original, path, **arrays):
    original(path, **arrays)
    os.truncate(path, os.path.getsize(path) // 2)

if sys.argv[1] == "checkpoint":
    ours = lambda *args, **kwargs: "/checkpoints/" in str(kwargs.get("destination_prefix", args[1:2]))
    gen_io_ops.merge_v2_checkpoints = second_call_killed(
        gen_io_ops.merge_v2_checkpoints, ours, lambda *args, **kwargs: None)
else:
    np.savez = second_call_killed(np.savez, lambda path, **arrays: True, half_written)
sys.argv[1:2] = []
train.run()
"""


@pytest.mark.parametrize("point", ["checkpoint", "replay"])
def test_a_kill_while_saving_resumes_from_the_save_before(tmp_path, point):
    bindings = ["--gin_file=catch_dqn.gin",
                "--gin_bindings=train_off_policy.checkpoint_replay = True",
                "--gin_bindings=RunConfig.checkpoint_interval_frames = 1600",
                "--gin_bindings=RunConfig.log_interval_frames = 500"]  # fmt: skip
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_IN_SAVE, point, f"--root_dir={tmp_path}", *bindings],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    workers, deadline = set(), time.monotonic() + 300
    while killed.poll() is None and time.monotonic() < deadline:
        workers |= set(descendants(killed.pid))
        time.sleep(0.1)
    assert killed.wait(timeout=1) == -signal.SIGKILL, killed.stderr.read()[-3000:]
    deadline = time.monotonic() + 15  # the workers exit once the trainer is gone
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers and not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
    assert not shm.left_by(killed.pid, *workers)
    left = os.listdir(tmp_path / "checkpoints")
    assert "ckpt-3200.index" not in left and "ckpt-1600.index" in left
    assert {"checkpoint": "ckpt-3200_temp", "replay": "replay-3200.npz.partial.npz"}[point] in left

    resumed = train(tmp_path, *bindings, "--gin_bindings=RunConfig.total_frames = 3600")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ckpt-1600 at 1,600 frames" in resumed.stdout and "replay restored" in resumed.stdout
    frames = [int(row["env_frames"]) for row in rows(tmp_path)]
    assert frames == sorted(set(frames)) and frames[-1] == 3600
    # The resumed run wrote ckpt-3200 again, whole, and no leftover stays.
    whole = [
        f"ckpt-{n}.{part}" for n in (1600, 3200, 3600) for part in ("data-00000-of-00001", "index")
    ]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint", *whole, "replay-3600.npz"]


def test_a_full_disk_while_saving_is_one_line_and_the_previous_checkpoint_resumes(tmp_path):
    first = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.total_frames = 1000")
    assert first.returncode == 0, first.stderr[-3000:]
    (saved,) = [
        name[:-6] for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".index")
    ]

    def quota():  # a 4 MB cap on any file written: the next checkpoint (~6 MB) cannot fit
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))

    full = subprocess.run(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=quota,
    )  # fmt: skip
    assert full.returncode != 0
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write checkpoint ckpt-"), full.stderr[-3000:]
    assert f"the previous checkpoint {saved} is intact" in last
    assert sorted(os.listdir(tmp_path / "checkpoints")) == sorted(
        ["checkpoint", f"{saved}.index", f"{saved}.data-00000-of-00001"]
    )  # the partial files are gone
    resumed = train(tmp_path, *SMOKE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{saved} at {int(saved.split('-')[1]):,} frames" in resumed.stdout


SCRIPTED = [
    "--gin_bindings=train.env = @ScriptedConfig()",
    "--gin_bindings=ScriptedConfig.height = 44",
    "--gin_bindings=ScriptedConfig.width = 20",
]


def test_a_failing_env_worker_is_replaced_and_the_run_goes_on(tmp_path):
    faulty = env_seeds(0, 4)[0]  # env 0's seed: its worker raises at its 200th step, once
    result = train(
        tmp_path, *SMOKE, *SCRIPTED, "--gin_bindings=ScriptedConfig.raise_at_step = 200",
        f"--gin_bindings=ScriptedConfig.faulty_seeds = ({faulty},)",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if "replaced by pid" in line]
    assert line.startswith("warning: worker 0 (pid") and "scripted fault at step 200" in line
    table = rows(tmp_path)
    assert int(table[0]["worker_restarts"]) == 0 and int(table[-1]["worker_restarts"]) == 1
    assert int(table[-1]["env_frames"]) >= 2000


def test_a_worker_that_keeps_failing_ends_the_run_with_one_line_and_a_checkpoint(tmp_path):
    result = train(
        tmp_path, *SMOKE, *SCRIPTED, "--gin_bindings=ScriptedConfig.crash_at_step = 350",
        "--gin_bindings=RunConfig.total_frames = 100_000", "--gin_bindings=PoolConfig.max_restarts = 1",
    )  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: worker ") and "killed by SIGKILL" in last, result.stderr[-3000:]
    assert "1 replaced within 600 s already; checkpoint saved" in last
    saved = [name for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".index")]
    # Crashes at ~1,400 frames (replaced) and ~2,800 (the end): saved there, not only at 1,000.
    assert max(int(name[5:-6]) for name in saved) > 2000


@pytest.mark.parametrize("action", ["skip", "restore", "stop"])
def test_a_nan_reward_skips_that_update_and_the_run_does_as_configured(tmp_path, action):
    # 4 envs in two alternating groups of 2: at their 300th step (~1,200 frames, after the
    # checkpoint at 1,000) every env returns a NaN reward: one rollout of each group has a NaN loss.
    result = train(
        tmp_path, *SMOKE, "--gin_bindings=train.env = @ScriptedConfig()",
        "--gin_bindings=ScriptedConfig.height = 44", "--gin_bindings=ScriptedConfig.width = 20",
        "--gin_bindings=ScriptedConfig.nan_reward_at_step = 300",
        f"--gin_bindings=RunConfig.on_nonfinite = '{action}'",
    )  # fmt: skip
    warning = "a non-finite value in the loss at "
    if action == "stop":
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {warning}") and "stopping" in last, result.stderr[-3000:]
        return
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if warning in line]
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert line.startswith("warning: ") and "1 SGD step(s) skipped" in line
        assert ("weights restored from ckpt-1000" in line) == (action == "restore")
    table = rows(tmp_path)
    assert int(table[-1]["skipped_updates"]) == 2 and int(table[0]["skipped_updates"]) == 0
    assert all(row["loss"] not in ("nan", "inf") for row in table[-2:])
    assert all(row["episode_return_raw_mean"] != "nan" for row in table)  # NaN games left out
    # The optimizer counts every update but the two skipped: a restore keeps its count (its
    # learning rate's schedule goes on), it does not go back to the checkpoint's.
    updates, iterations = (
        tf.train.load_variable(str(tmp_path / "checkpoints"), f"{name}/.ATTRIBUTES/VARIABLE_VALUE")
        for name in ("counters/updates", "optimizer/_iterations")
    )
    assert int(iterations) == int(updates) - 2, (iterations, updates)
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert (
        metadata["extra"]["env_frames"] >= 2000
    )  # the final policy was exported: its weights are finite


@pytest.mark.parametrize(
    "name, status, when",
    [("SIGINT", 130, "importing"), ("SIGTERM", 143, "importing"), ("SIGTERM", 143, "made")],
)
def test_a_stop_while_starting_is_one_line_and_its_status(tmp_path, name, status, when):
    """Before the loop takes SIGINT over (importing TensorFlow, loading the game, starting the
    pool) Ctrl-C printed a traceback; SIGTERM killed the process where it stood, which left the
    run directory it had made (a lock and tb/) and no word."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "bin", "train"), "--gin_file=a2c.gin",
         "--gin_file=smoke.gin", f"--root_dir={run}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    if when == "importing":
        time.sleep(1.5)  # importing TensorFlow
    else:  # the run directory is made; the env pool starts next
        deadline = time.time() + 60
        while not (run / "tb").exists() and time.time() < deadline:
            time.sleep(0.01)
    process.send_signal(getattr(signal, name))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == status and "Traceback" not in stderr, stderr[-3000:]
    assert (
        stderr.strip().splitlines()[-1] == f"stopped by {name} while starting: nothing was trained"
    )
    assert not run.exists()
