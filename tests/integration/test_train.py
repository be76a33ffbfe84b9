"""bin/train end to end: artifacts, resume, Ctrl-C, learning on Catch, and user errors."""

import csv
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
from tfaccel import networks
from tfaccel.bench.memory import descendants, state
from tfaccel.envs.pool import env_seeds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = ["--gin_file=a2c.gin", "--gin_file=smoke.gin"]


def train(root_dir, *args, timeout=300, env=None):
    """bin/train to its end; the result also has the process's `pid`, which names its shared memory."""
    with subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={root_dir}", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as process:  # fmt: skip
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    result.pid = process.pid
    return result


def rows(root_dir):
    with open(os.path.join(root_dir, "metrics.csv"), newline="") as handle:
        return list(csv.DictReader(handle))


def logged_frames(root_dir) -> int:
    """The env frames of the last metrics row, 0 before the first (also while it is written)."""
    try:
        return int(rows(root_dir)[-1]["env_frames"])
    except (OSError, IndexError, KeyError, TypeError, ValueError):
        return 0


@pytest.mark.fast
def test_smoke_run_writes_every_artifact(tmp_path):
    result = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.eval_episodes = 1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2,000 frames (500 agent steps)" in result.stdout
    summary = result.stdout.strip().splitlines()[-6:]  # the score, then where things are
    assert summary[0].startswith("score") and summary[1] == f"run directory {tmp_path}:"
    assert f"bin/plot --run_dir={tmp_path}" in summary[4]  # a command of this checkout
    assert f"bin/eval --policy_dir={tmp_path}/policy" in summary[3]
    table = rows(tmp_path)
    assert 100 < float(table[-1]["peak_rss_mib"]) < 8_000  # the trainer's, in MiB
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
    assert "RunConfig.total_frames = 2000" in config and "AtariConfig.game = 'pong'" in config
    assert (tmp_path / "checkpoints" / "checkpoint").exists()
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "tb"))
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["preprocessing"]["game"] == "pong" and metadata["extra"]["env_frames"] == 2000
    evaluations = list(csv.DictReader(open(tmp_path / "eval.csv", newline="")))
    assert [int(row["env_frames"]) for row in evaluations][-1] == 2000
    assert float(evaluations[-1]["eval_return_mean"]) <= -15  # an untrained Pong policy loses


def test_same_command_resumes_counters_and_csv(tmp_path):
    first = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.total_frames = 1000")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(tmp_path, *SMOKE)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    (kept,) = tmp_path.glob("operative_config.*.gin")  # the first run's settings, kept
    assert (
        f"warning: resumed with 1 setting(s) changed since the run last ran (its settings then: "
        f"{kept}): RunConfig.total_frames: 1000 -> 2000"
    ) in second.stdout
    assert "RunConfig.total_frames = 1000" in kept.read_text()
    assert "RunConfig.total_frames = 2000" in (tmp_path / "operative_config.gin").read_text()
    table = rows(tmp_path)
    frames = [int(row["env_frames"]) for row in table]
    assert frames == sorted(frames) and frames[0] < 1200 < 2000 <= frames[-1] < 2100
    wall = [float(row["wall_s"]) for row in table]
    assert wall == sorted(wall)  # wall time continues too
    assert open(tmp_path / "metrics.csv").read().count("env_frames") == 1  # one header
    again = train(tmp_path, *SMOKE)  # nothing left to do: says so and trains no further
    assert again.returncode == 0 and "the run is complete" in again.stdout
    assert "setting(s) changed" not in again.stdout  # the same settings: nothing to say
    assert len(rows(tmp_path)) == len(table)


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
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE,
         "--gin_bindings=RunConfig.total_frames = 10_000_000",
         "--gin_bindings=RunConfig.checkpoint_interval_frames = 1_200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while logged_frames(tmp_path) < 2000:
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
    resumed = train(tmp_path, *SMOKE, f"--gin_bindings=RunConfig.total_frames = {logged + 800}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at {saved:,} frames" in resumed.stdout  # lost: only the work since the checkpoint
    frames = [int(row["env_frames"]) for row in rows(tmp_path)]
    assert frames == sorted(set(frames)) and frames[-1] >= logged + 800  # each frame count once
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
    "args",
    [
        ["--gin_file=catch_a2c.gin"],
        ["--gin_file=catch_ppo.gin"],
        ["--gin_file=catch_dqn.gin"],
        ["--gin_file=catch_dqn.gin", "--gin_bindings=DQNConfig.num_atoms = 51"],
        ["--gin_file=catch_a3c.gin"],
        ["--gin_file=catch_appo.gin"],
        ["--gin_file=catch_vector_ppo.gin"],
        ["--gin_file=catch_a2c.gin", "--gin_bindings=set_precision.policy = 'mixed_bfloat16'"],
        ["--gin_file=catch_dqn.gin", "--gin_bindings=set_precision.policy = 'mixed_bfloat16'"],
    ],
    ids=[
        "a2c",
        "ppo",
        "dqn",
        "categorical_dqn",
        "a3c",
        "appo",
        "ppo_vector",
        "a2c_bf16",
        "dqn_bf16",
    ],
)
def test_learns_catch_in_seconds(tmp_path, args):
    result = train(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(row["episode_return_raw_mean"]) for row in rows(tmp_path)]
    assert min(scores[:3]) < 0.2  # a random paddle misses most balls (mean about -0.6)
    assert max(scores[-3:]) >= 0.6, scores
    if any("mixed_bfloat16" in arg for arg in args):  # said where this machine emulates it
        slow = networks.precision_warning("mixed_bfloat16") is not None
        assert ("warning: mixed_bfloat16" in result.stdout) == slow, result.stdout[-2000:]


# Columns of metrics.csv that measure time or memory, not learning: they differ between runs.
TIMING = {"wall_s", "fps", "replay_wait_fraction", "peak_rss_mib"} | {
    f"{part}_fraction" for part in ("env", "inference", "learn")
}


@pytest.mark.parametrize(
    "trainer, args",
    [
        ("train", ["--gin_file=catch_a2c.gin", "--gin_bindings=RunConfig.total_frames = 6_000",
                   "--gin_bindings=RunConfig.log_interval_frames = 2_000"]),
        ("train_off_policy", ["--gin_file=catch_dqn.gin", "--gin_bindings=train_off_policy.prefetch = False",
                              "--gin_bindings=RunConfig.total_frames = 3_000"]),
    ],
    ids=["a2c", "dqn"],
)  # fmt: skip
def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path, trainer, args):
    """Initial weights, envs, actions and batches all follow the seed (one worker: a fixed order)."""
    runs = {}
    for name, seed in [("first", 3), ("again", 3), ("other", 4)]:
        result = train(tmp_path / name, *args, f"--gin_bindings=RunConfig.seed = {seed}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = [
            {column: value for column, value in row.items() if column not in TIMING}
            for row in rows(tmp_path / name)
        ]
    assert len(runs["first"]) >= 2 and "grad_norm" in runs["first"][0]
    assert runs["again"] == runs["first"]
    assert runs["other"] != runs["first"]


@pytest.mark.parametrize(
    "config, columns",
    [
        pytest.param("ppo.gin", {"approx_kl", "clip_fraction"}, marks=pytest.mark.fast),
        ("reference/a2c_stooke2018_256envs.gin", {"policy_loss", "entropy"}),
        ("reference/a2c_baselines.gin", {"policy_loss", "entropy"}),
        ("a2c_bf16.gin", {"policy_loss", "entropy"}),
    ],
)
def test_every_config_runs_with_smoke(tmp_path, config, columns):
    bindings = ["--gin_bindings=train.horizon = 16"] if config == "ppo.gin" else []
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin", *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert int(table[-1]["env_frames"]) >= 2000
    assert columns <= set(table[-1])
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    if config == "reference/a2c_baselines.gin":  # Baselines' frames: the whole screen, 84x84
        described = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
        assert described["observation"]["shape"] == [84, 84, 4]
        assert described["preprocessing"]["crop_top"] == 0
    if config == "a2c_bf16.gin":  # its rate is constant, and its torso computes in bfloat16
        assert [float(row["learning_rate"]) for row in table] == pytest.approx([7e-4] * len(table))
        assert (
            "set_precision.policy = 'mixed_bfloat16'"
            in (tmp_path / "operative_config.gin").read_text()
        )
        return
    # The learning rate falls linearly with the frames done, however many SGD steps an update
    # takes (PPO: epochs x minibatches); one rollout of frames may still be ahead of the row.
    initial = {
        "ppo.gin": 2.5e-4,
        "reference/a2c_stooke2018_256envs.gin": 1.4e-3,
        "reference/a2c_baselines.gin": 7e-4,
    }[config]
    for row in table:
        remaining = 1 - int(row["env_frames"]) / 2000
        assert float(row["learning_rate"]) == pytest.approx(initial * remaining, abs=0.25 * initial)
    assert float(table[0]["learning_rate"]) > 0.5 * initial


@pytest.mark.parametrize("config", ["a2c.gin", "ppo.gin", "categorical_dqn.gin"])
def test_mirrored_strategy_trains_every_family(tmp_path, config):
    horizon = ["--gin_bindings=train.horizon = 16"] if config == "ppo.gin" else []
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin",
                   "--gin_file=distribute/mirrored.gin", *horizon)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "make_strategy.kind = 'mirrored'" in (tmp_path / "operative_config.gin").read_text()
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 2000
    assert (tmp_path / "policy" / "saved_model.pb").exists()


def test_warmup_frames_raise_the_rate_linearly_then_hold_it(tmp_path):
    result = train(
        tmp_path, *SMOKE, "--gin_bindings=train.decay_learning_rate = False",
        "--gin_bindings=train.warmup_frames = 1200",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    # One update per rollout of a group: 2 envs x 5 steps x frame skip 4 = 40 frames; the
    # warm-up is 1,200 / 40 = 30 updates, and a row shows the rate of the update after it.
    first = int(table[0]["env_frames"])
    expected = 7e-4 * (first // 40) / 30  # the rate of the last step taken
    assert float(table[0]["learning_rate"]) == pytest.approx(expected, rel=1e-5)  # 6 digits
    assert float(table[-1]["learning_rate"]) == pytest.approx(7e-4)
    rates = [float(row["learning_rate"]) for row in table]
    assert rates == sorted(rates) and rates[0] < 7e-4 / 2


@pytest.mark.parametrize(
    "config, head",
    [
        ("dqn.gin", "q_values"),
        pytest.param("categorical_dqn.gin", "probabilities", marks=pytest.mark.fast),
        ("rainbow.gin", "probabilities"),
        ("reference/dqn_nature2015.gin", "q_values"),
        ("reference/c51_dopamine.gin", "probabilities"),
        ("reference/c51_stooke2018_b2048.gin", "probabilities"),
        ("reference/rainbow_hessel2018.gin", "probabilities"),
    ],
)
def test_every_q_config_runs_with_smoke(tmp_path, config, head):
    evaluation = (  # a checkpoint at every 400 frames, the last at the end: saved once
        [
            "--gin_bindings=RunConfig.eval_episodes = 1",
            "--gin_bindings=RunConfig.checkpoint_interval_frames = 400",
        ]
        if config == "dqn.gin"
        else []
    )
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin", *evaluation)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert int(table[-1]["env_frames"]) == 2000
    assert table[-1]["loss"] and float(table[-1]["epsilon"]) < 1.0  # it trained from replay
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["head"] == head and metadata["num_actions"] == 6
    if evaluation:  # the exported Q policy played a full game at each checkpoint
        scores = list(csv.DictReader(open(tmp_path / "eval.csv", newline="")))
        assert [int(row["env_frames"]) for row in scores] == [400, 800, 1200, 1600, 2000]
        assert float(scores[-1]["eval_return_mean"]) <= -15  # an untrained Pong policy loses


def test_off_policy_run_trains_from_replay_exports_and_resumes(tmp_path):
    bindings = ["--gin_bindings=RunConfig.total_frames = 3000",
                "--gin_bindings=RunConfig.checkpoint_interval_frames = 1500"]  # fmt: skip
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


def test_replay_is_checkpointed_on_request_and_restored(tmp_path):
    bindings = ["--gin_bindings=train_off_policy.checkpoint_replay = True",
                "--gin_bindings=RunConfig.total_frames = 3000",
                "--gin_bindings=RunConfig.checkpoint_interval_frames = 1500",
                "--gin_bindings=RunConfig.log_interval_frames = 200"]  # fmt: skip
    first = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = sorted(os.listdir(tmp_path / "checkpoints"))
    assert [name for name in saved if name.startswith("replay-")] == ["replay-3000.npz"]
    stored = int(rows(tmp_path)[-1]["replay_size"])
    assert stored > 2500  # 3000 steps less the windows still open

    resumed = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings[:2],
                    "--gin_bindings=RunConfig.total_frames = 3400")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "replay restored" in resumed.stdout
    after = [row for row in rows(tmp_path) if int(row["env_frames"]) > 3000]
    # The restored memory is there at once: no refill from zero, and learning goes on.
    assert int(after[0]["replay_size"]) >= stored and float(after[0]["learn_fraction"]) > 0
    assert sorted(os.listdir(tmp_path / "checkpoints")).count("replay-3400.npz") == 1
    assert "replay-3000.npz" not in os.listdir(tmp_path / "checkpoints")

    (tmp_path / "checkpoints" / "replay-3400.npz").write_bytes(b"not a zip file")
    broken = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings[:2],
                   "--gin_bindings=RunConfig.total_frames = 3800")  # fmt: skip
    assert broken.returncode != 0
    assert "cannot restore the replay memory from" in broken.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--gin_bindings=RunConfig.totl_frames = 1"],
            "bad gin config: RunConfig has no parameter 'totl_frames'; did you mean total_frames",
        ),
        (
            [
                "--gin_bindings=train.torso = @nature_torso",
                "--gin_bindings=train.env = @CatchConfig()",
            ],
            "the torso nature_torso does not fit this env's observations (uint8 [44, 20, 1])",
        ),
        (
            ["--gin_bindings=AtariConfig.game = 'pongg'"],
            "unknown Atari game 'pongg'; closest valid names: pong",
        ),
        (
            ["--gin_file=no_such.gin"],
            "gin file 'no_such.gin' not found; configs in gin_configs/: a2c.gin",
        ),
        (["--gin_bindings=PoolConfig.num_groups = 3"], "num_groups must be 1 or 2, got 3"),
        (  # it trained, climbing the loss
            ["--gin_bindings=train.learning_rate = -1e-3"],
            "train.learning_rate must be a positive number (e.g. 7e-4), got -0.001",
        ),
        (
            ["--gin_bindings=A2CConfig.entropy_cost = '0.01'"],
            "A2CConfig.entropy_cost = '0.01': it must be a float",
        ),
        (
            ["--gin_file=catch_ppo.gin", "--gin_bindings=PPOConfig.minibatches = 5"],
            "a rollout of 128 samples per replica (train.horizon 16 x 8 envs: "
            "PoolConfig.num_workers x envs_per_worker / num_groups) does not split into "
            "PPOConfig.minibatches = 5",
        ),
        (
            ["--gin_file=distribute/mirrored.gin", "--gin_bindings=make_strategy.logical_cpus = 3"],
            "the number of envs per group is 2, which does not split among 3 replicas",
        ),
        (
            ["--gin_bindings=make_strategy.kind = 'multi_worker'"],
            "make_strategy.kind = 'multi_worker' needs TF_CONFIG",
        ),
        (
            ["--gin_bindings=make_strategy.kind = 'ps'"],
            "valid kinds: default, mirrored, multi_worker",
        ),
        (
            ["--gin_bindings=import no_such_module_here"],
            "No module named 'no_such_module_here': put its directory on PYTHONPATH",
        ),
        (
            [
                "--gin_file=catch_dqn.gin",
                "--gin_bindings=train_off_policy.replay_capacity = 1_000_000_000_000",
            ],
            "available: lower train_off_policy.replay_capacity",
        ),
        (
            ["--gin_file=catch_dqn.gin", "--gin_bindings=train_off_policy.batch_size = 65"],
            "train_off_policy.batch_size = 65 does not split into 2 equal shares",
        ),
        (
            [
                "--gin_file=catch_dqn.gin",
                "--gin_bindings=train_off_policy.replay_capacity = 1_000",
            ],
            "train_off_policy.min_replay_steps = 1,000 is never reached: a replay of 1,000 "
            "transitions on 8 envs holds at most",
        ),
        (
            ["--gin_file=catch_dqn.gin", "--gin_bindings=CatchConfig.vector = True"],
            "the replay stores uint8 frames [H, W, stack], one frame per step; this env observes "
            "float32 [3]",
        ),
        (
            ["--gin_bindings=PoolConfig.envs_per_worker = 0"],
            "PoolConfig.envs_per_worker 1 or more, got 1 and 0",
        ),
        (
            ["--gin_bindings=set_precision.policy = 'float16'"],
            "unknown precision 'float16'; valid: auto, float32, mixed_bfloat16",
        ),
        (
            ["--gin_bindings=RunConfig.on_nonfinite = 'ignore'"],
            "on_nonfinite must be one of ('skip', 'restore', 'stop'), got 'ignore'",
        ),
        (  # wrong types were a TypeError traceback
            ['--gin_bindings=PoolConfig.envs_per_worker = "four"'],
            "PoolConfig.envs_per_worker = 'four': it must be an int",
        ),
        (
            ["--gin_bindings=PoolConfig.num_workers = 2.5"],
            "PoolConfig.num_workers = 2.5: it must be an int",
        ),
        (  # gin's check leaves None alone: it was a 45-line TypeError
            ["--gin_bindings=RunConfig.seed = None"],
            "RunConfig.seed must be an int, got None (NoneType)",
        ),
        (
            ["--gin_bindings=trian.total_frames = 5"],  # a misspelt configurable
            "no configurable named 'trian'; did you mean train? configurables: ",
        ),
        (  # the replay's batch under the mirrored strategy
            [
                "--gin_file=catch_dqn.gin",
                "--gin_file=distribute/mirrored.gin",
                "--gin_bindings=make_strategy.logical_cpus = 3",
            ],
            "train_off_policy.batch_size is 64, which does not split among 3 replicas",
        ),  # fmt: skip
        (  # an oversized layout was an OOM kill of some process, with no word
            ["--gin_bindings=PoolConfig.num_workers = 100_000"],
            "100,000 env workers of 4 envs need about",
        ),
        (
            ["--gin_bindings=train.env = 42"],
            "train.env = 42: it takes a reference to a function or factory, e.g. @AtariConfig()",
        ),
        (
            ["--gin_file=ppo.gin"],  # a second algorithm after a2c.gin: the last won, silently
            "two algorithm configs, a2c.gin and ppo.gin: give one",
        ),
    ],
)
def test_user_errors_end_with_one_line(tmp_path, args, message):
    toy = any(arg.startswith("--gin_file=catch") for arg in args)  # an algorithm config itself
    result = train(tmp_path / "run", *([] if toy else SMOKE), *args, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing trained: no run directory left behind


def test_a_second_command_on_a_run_directory_in_training_stops_with_one_line(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE,
         "--gin_bindings=RunConfig.total_frames = 10_000_000"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not logged_frames(tmp_path):
            assert time.time() < deadline and first.poll() is None, first.stderr.read()
            time.sleep(0.5)
        rows_before = len(rows(tmp_path))
        second = train(tmp_path, *SMOKE, timeout=120)
        assert second.returncode == 1, second.stderr[-2000:]
        last = second.stderr.strip().splitlines()[-1]
        assert f"{tmp_path} is being trained by another process (pid {first.pid}:" in last, last
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first goes on, its log its own
        assert len(rows(tmp_path)) >= rows_before
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(120)
    again = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.total_frames = 1")  # the lock is free
    assert again.returncode == 0 and "the run is complete" in again.stdout, again.stderr[-2000:]


def test_no_algorithm_config_or_a_file_as_run_directory_ends_with_one_line(tmp_path):
    alone = train(tmp_path / "run", "--gin_file=smoke.gin", timeout=120)
    assert alone.returncode != 0 and "Traceback" not in alone.stderr
    assert "start the --gin_file list with an algorithm's config" in alone.stderr
    assert "configs: a2c.gin" in alone.stderr.strip().splitlines()[-1]
    (tmp_path / "a_file").write_text("")
    on_a_file = train(tmp_path / "a_file", *SMOKE, timeout=120)
    assert on_a_file.returncode != 0 and "Traceback" not in on_a_file.stderr
    assert str(tmp_path / "a_file") in on_a_file.stderr.strip().splitlines()[-1]


IN_PROCESS_ENV = """
import dataclasses, sys
import keras
from tfaccel import on_policy, runner
from tfaccel.algorithms import a2c
from tfaccel.envs.toy import CatchConfig


@dataclasses.dataclass(frozen=True)
class NotebookCatch(CatchConfig):  # defined in __main__: worker processes could not import it
    pass


class TwoHeads(keras.Model):  # a whole network of one's own, built lazily, without a `spec`
    def __init__(self, num_actions):
        super().__init__()
        self.body = [keras.layers.Conv2D(8, 4, strides=2, activation="relu"),
                     keras.layers.Flatten(), keras.layers.Dense(32, activation="relu")]
        self.logits, self.value = keras.layers.Dense(num_actions), keras.layers.Dense(1)

    def call(self, observation):
        x = keras.ops.cast(observation, "float32") / 255.0
        for layer in self.body:
            x = layer(x)
        return self.logits(x), keras.ops.squeeze(self.value(x), -1)


def small_network(spec):  # train.network: it ended with "Unknown variable" (not built), then
    return TwoHeads(spec.num_actions)  # "cannot tell the observation shape" at the export


import gin  # in bfloat16 its Dense heads returned bfloat16, which the loss refused
gin.bind_parameter("set_precision.policy", "mixed_bfloat16")
summary = on_policy.train(
    sys.argv[1], env=NotebookCatch(), loss_fn=a2c.loss, act_fn=a2c.act,
    algorithm=a2c.A2CConfig(), pool_config=runner.PoolConfig(num_workers=0, envs_per_worker=4),
    run_config=runner.RunConfig(
        total_frames=800, log_interval_frames=400, checkpoint_interval_frames=800
    ),
    network=small_network,
)
print("frames", summary["env_frames"])
"""


def test_zero_workers_step_an_env_defined_in_main_with_a_network_of_ones_own(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", IN_PROCESS_ENV, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split("frames")[-1]) >= 800
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 800
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    shapes = [shape for _, shape in tf.train.list_variables(str(tmp_path / "checkpoints"))]
    assert [4, 4, 1, 8] in shapes  # the network of one's own was trained and saved


def test_ppo_learns_gymnasium_cartpole(tmp_path):
    result = train(tmp_path, "--gin_file=cartpole_ppo.gin")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(row["episode_return_raw_mean"]) for row in rows(tmp_path)]
    # A random policy balances for about 22 steps; the first row averages the episodes of the
    # first ~5 updates (25 to 45 seen). The last rows reach 100 to 160 (README), well above both.
    assert scores[0] < 60, scores
    assert max(scores[-3:]) >= max(80, 1.5 * scores[0]), scores


@pytest.mark.parametrize("config, torso", [("a2c.gin", "a3c_torso"), ("dqn.gin", "nature_torso")])
def test_the_background_is_measured_once_and_resumed_and_exported(tmp_path, config, torso):
    import tensorflow as tf

    bindings = [f"--gin_file={config}", "--gin_file=smoke.gin",
                f"--gin_bindings={torso}.subtract_background = True"]  # fmt: skip
    first = train(tmp_path, *bindings)
    assert first.returncode == 0, first.stderr[-3000:]
    (line,) = [line for line in first.stdout.splitlines() if "background pixel" in line]
    measured = float(line.rsplit(" ", 1)[1])
    assert measured == pytest.approx(87 / 255, abs=1e-4)  # Pong's
    more = train(tmp_path, *bindings, "--gin_bindings=RunConfig.total_frames = 2800")
    assert more.returncode == 0 and "background pixel" not in more.stdout, more.stderr[-3000:]
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    offsets = [name for name in reader.get_variable_to_shape_map() if "offset" in name]
    assert offsets and all(
        reader.get_tensor(n) == pytest.approx(measured, abs=1e-4) for n in offsets
    )
    assert len(offsets) == (2 if config == "dqn.gin" else 1)  # the target network's too
    served = tf.saved_model.load(str(tmp_path / "policy")).signatures["serving_default"]
    assert served(observation=tf.zeros([1, 104, 80, 4], tf.uint8))  # the export runs with it


def test_resuming_with_another_algorithm_is_one_line_naming_both(tmp_path):
    """It ended with a tensor-shape error from deep inside the checkpoint's restore."""
    first = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin")
    assert first.returncode == 0, first.stderr[-3000:]
    other = train(tmp_path, "--gin_file=catch_dqn.gin", "--gin_file=smoke.gin")
    assert other.returncode == 1 and "Traceback" not in other.stderr
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path} holds a run of another algorithm or network")
    assert "train.loss_fn = @a2c_loss" in line and "run.trainer = @train_off_policy" in line
    same = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                 "--gin_bindings=RunConfig.total_frames = 2800")  # fmt: skip
    assert same.returncode == 0, same.stderr[-3000:]


def test_resuming_with_settings_that_change_the_variables_names_them(tmp_path):
    """A schedule where the run had a constant rate (the optimizer loses a variable) ended with
    "no checkpoint can be restored ...: move the directory away", and a screen of warnings."""
    first = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin")
    assert first.returncode == 0, first.stderr[-3000:]
    other = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                  "--gin_bindings=train.decay_learning_rate = True")  # fmt: skip
    assert other.returncode == 1 and "Traceback" not in other.stderr
    (line,) = [line for line in other.stderr.strip().splitlines() if "precision" not in line]
    assert line.startswith(f"error: the checkpoints of {tmp_path} do not fit"), line
    assert "train.decay_learning_rate: False -> True" in line and "new --root_dir" in line
    same = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                 "--gin_bindings=RunConfig.total_frames = 2800")  # fmt: skip
    assert same.returncode == 0, same.stderr[-3000:]


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


def test_a_ppo_smoke_run_updates_at_a_rate_above_zero(tmp_path):
    """smoke.gin's 2,000 frames are less than one PPO rollout (8 envs x 128 steps x 4 frames):
    the decay spanned 0 rollouts, and the run's only update took its steps at rate 0."""
    result = train(tmp_path, "--gin_file=ppo.gin", "--gin_file=smoke.gin")
    assert result.returncode == 0, result.stderr[-3000:]
    rates = [float(row["learning_rate"]) for row in rows(tmp_path) if row.get("learning_rate")]
    # Rollouts of 2 envs x 128 steps x 4 frames = 1,024 frames: the decay spans the 2 rollouts
    # the run could take (32 SGD steps); it took one, its last step (15) at 2.5e-4 x 17 / 32.
    assert rates and rates[-1] == pytest.approx(2.5e-4 * 17 / 32, rel=1e-3)
