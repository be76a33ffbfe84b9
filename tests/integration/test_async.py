"""Asynchronous runs through bin/train: two learner processes around the parameter store."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import shm
from tests.fakes import as_from_a_terminal
from tests.integration.cluster import start_cluster
from tests.integration.commands import ROOT, rows, train
from tfaccel.bench.memory import descendants, state


def updates(checkpoints) -> int:
    """The updates a learner made, from its latest checkpoint."""
    return int(
        tf.train.load_variable(str(checkpoints), "counters/updates/.ATTRIBUTES/VARIABLE_VALUE")
    )


@pytest.mark.fast
def test_a3c_runs_resumes_and_leaves_no_store(tmp_path):
    first = train(tmp_path, "--gin_file=a3c.gin", "--gin_file=smoke.gin",
                  "--gin_bindings=RunConfig.total_frames = 1000")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "training on 2 x 4 envs, " in first.stdout  # two learners (said "on 4 envs")
    assert (tmp_path / "learner-1" / "checkpoints" / "checkpoint").exists()
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    assert not (tmp_path / "learner-1" / "policy").exists()  # only the chief exports
    done_first = int(rows(tmp_path)[-1]["env_frames"])
    assert done_first >= 1000
    # Both learners' steps count: the agent steps the chief logs are those both learners'
    # updates took (each 2 envs of one group x 5 steps under smoke.gin), give or take the
    # rollout each had in flight (the other group's) and learner-1's last update, which may come
    # after the chief's count. Counting the chief's alone falls short once learner-1 made 3.
    own = [updates(path / "checkpoints") * 2 * 5 for path in (tmp_path, tmp_path / "learner-1")]
    assert sum(own) - 2 * 10 <= done_first // 4 <= sum(own) + 2 * 10, (own, done_first)
    second = train(tmp_path, "--gin_file=a3c.gin", "--gin_file=smoke.gin")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    frames = [int(row["env_frames"]) for row in rows(tmp_path)]
    assert frames == sorted(frames) and frames[-1] >= 2000  # the counter went on
    assert not shm.left_by(first.pid, second.pid)


@pytest.mark.parametrize("config", ["appo.gin"])
def test_appo_runs_with_smoke(tmp_path, config):
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin",
                   "--gin_bindings=train.horizon = 16")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # The learners are spawned processes: nothing of TensorFlow's C++ start-up from them either.
    assert "oneDNN" not in result.stderr and "cuda" not in result.stderr.lower(), result.stderr
    config_text = (tmp_path / "operative_config.gin").read_text()
    assert (
        "train_async.learners = 2" in config_text
        and "train.learning_rate = 0.000125" in config_text
    )
    assert (tmp_path / "policy" / "saved_model.pb").exists()


def test_a_failing_learner_ends_the_run_with_its_error(tmp_path):
    """A setting the learners reject once they made their directories: the run ends with the
    learner's error, no advice to resume (it would fail again) and no directory left."""
    result = train(tmp_path / "run", "--gin_file=a3c.gin", "--gin_file=smoke.gin",
                   "--gin_bindings=PoolConfig.num_workers = 100_000")  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: learner ") and "100,000 env workers of" in last, last
    assert "resumes" not in last
    assert "Traceback" not in result.stderr, result.stderr[-3000:]  # the line says it all
    assert not (tmp_path / "run").exists()
    assert not shm.left_by(result.pid)


def test_async_gin_alone_names_the_algorithm_configs_to_give_it(tmp_path):
    """It was learner tracebacks and `Required bindings ...; the same command resumes`."""
    result = train(tmp_path / "run", "--gin_file=async.gin", "--gin_file=smoke.gin")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "start the --gin_file list with an algorithm's config" in last, last
    assert "resumes" not in last and not (tmp_path / "run").exists()


def start_machines(root_dir, *bindings):
    """Two asynchronous 'machines' (launcher + 1 learner each) on 127.0.0.1, synchronized."""
    files = ["catch_a3c.gin", "distribute/async_machines.gin"]
    return start_cluster(root_dir, files, ["train_async.learners = 1", *bindings])


def run_machines(root_dir, *bindings) -> str:
    """Runs two machines to their end; returns the parameters' digest both report."""
    machines = start_machines(root_dir, *bindings)
    outputs = [machine.communicate(timeout=300) for machine in machines]
    for machine, (_, err) in zip(machines, outputs, strict=True):
        assert machine.returncode == 0, err[-3000:]
        assert "cuda" not in err.lower(), err[-3000:]  # the CUDA probe's line, silenced
    lines = [re.search(r"machine sync: (\d+) rounds among 2 machines; parameters (\w+)", out)
             for out, _ in outputs]  # fmt: skip
    assert all(lines), outputs[0][0][-2000:]
    assert lines[0].group(2) == lines[1].group(2)  # the same parameters on both machines
    assert int(lines[0].group(1)) >= 2
    assert not shm.left_by(*[machine.pid for machine in machines])
    return lines[0].group(2)


def network_values(checkpoints) -> dict:
    reader = tf.train.load_checkpoint(str(checkpoints))
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(str(checkpoints))
        if name.startswith("network/")
    }


def test_two_machines_average_their_stores_and_share_the_frames(tmp_path):
    bindings = ("RunConfig.total_frames = 8_000", "train.decay_learning_rate = True")
    digest = run_machines(tmp_path, *bindings)
    # The decay spans the updates of both machines' learners: 8,000 frames / (2 learners x 4 envs
    # of a group x 5 steps) = 200 updates each (counting one machine's, 400). The split of the
    # frames between the machines depends on the load, so each learner's last rate is checked
    # against its own update count, which its final row and checkpoint share.
    decay_updates = 8000 // (2 * 4 * 5)
    for run_dir in (tmp_path, tmp_path / "machine-1"):
        table = rows(run_dir)
        # Frames count the envs of both machines.
        assert int(table[-1]["env_frames"]) >= 8000
        assert float(table[-1]["wall_s"]) > 0
        taken = updates(run_dir / "checkpoints")
        assert taken > 0
        # The rate logged is that of the last update taken (step `taken - 1`).
        expected = 1e-3 * max(0.0, 1 - (taken - 1) / decay_updates)
        assert float(table[-1]["learning_rate"]) == pytest.approx(expected, abs=1e-7), (
            taken,
            table[-1],
        )
    # Both machines saved the last round's parameters (each had its own progress since the
    # round before), so the same command on the finished run leaves them as they are.
    chief, other = (
        network_values(path / "checkpoints") for path in (tmp_path, tmp_path / "machine-1")
    )
    assert chief.keys() == other.keys() and len(chief) > 2
    for name, value in chief.items():
        np.testing.assert_array_equal(value, other[name], err_msg=name)
    assert run_machines(tmp_path, *bindings) == digest


def test_a_killed_learner_of_one_machine_ends_both_machines_saved(tmp_path):
    """Its launcher names it; the other learners stop through the stores, take the last round
    and save (none is SIGTERMed, none waits for a round that never comes); the other machine
    stops with the run."""
    machines = start_machines(
        tmp_path, "RunConfig.total_frames = 10_000_000", "train_async.learners = 2"
    )
    lock, deadline = tmp_path / "machine-1" / "learner-1" / ".lock", time.time() + 240
    while not (
        holder := re.search(r"its learner pid (\d+)", lock.read_text() if lock.exists() else "")
    ):
        assert time.time() < deadline and machines[0].poll() is None, machines[0].stderr.read()
        time.sleep(0.5)
    while not (tmp_path / "machine-1" / "learner-1" / "metrics.csv").exists():  # it trains
        assert time.time() < deadline, machines[1].stderr.read()
        time.sleep(0.5)
    os.kill(int(holder.group(1)), signal.SIGKILL)
    started = time.time()
    (out, err), (out_1, err_1) = [machine.communicate(timeout=180) for machine in machines]
    assert time.time() - started < 60  # no learner waited out a grace period
    assert machines[1].returncode == 1 and err_1.strip().splitlines()[-1].startswith(
        "error: learner 1 of the asynchronous run failed: killed by SIGKILL"
    ), err_1[-2000:]
    assert "stopped with another process of the run" in out_1 and "SIGTERM" not in out_1
    assert machines[0].returncode == 0, err[-2000:]
    assert "stopped with another process of the run" in out and "machine sync:" in out
    for run_dir in (tmp_path, tmp_path / "learner-1", tmp_path / "machine-1"):
        assert (run_dir / "checkpoints" / "checkpoint").exists(), run_dir


def test_a_dead_machine_stops_the_other_with_one_line_and_no_learner_left(tmp_path):
    machines = start_machines(
        tmp_path, "RunConfig.total_frames = 10_000_000", "make_strategy.timeout_seconds = 20"
    )
    deadline = time.time() + 240
    while not (tmp_path / "machine-1" / "metrics.csv").exists():
        assert time.time() < deadline and machines[0].poll() is None, machines[0].stderr.read()
        time.sleep(0.5)
    orphans = descendants(machines[1].pid)  # its learner, and that learner's env workers
    machines[1].kill()  # SIGKILL: its learner is orphaned and must stop by itself
    machines[1].wait()
    out, err = machines[0].communicate(timeout=180)
    assert machines[0].returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: a worker of the multi-worker run stopped answering"), last
    # Its learner stopped with the run, saving; nobody had sent it a SIGTERM to blame.
    assert "stopped by SIGTERM" not in out and "stopped with another process" in out, out[-2000:]
    deadline = time.time() + 60
    while any(state(pid) not in ("", "Z") for pid in orphans) and time.time() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in orphans if state(pid) not in ("", "Z")], "learners left"
    # the orphaned chief removed its machine's store
    assert not shm.left_by(*[machine.pid for machine in machines], *orphans)


@pytest.mark.parametrize(
    "name, status, to",
    [("SIGTERM", 143, "launcher"), ("SIGINT", 130, "group"), ("SIGTERM", 143, "learner-1")],
    # the launcher alone, as a job scheduler stops a job; Ctrl-C: the terminal's group; one
    # learner alone (by its pid)
    ids=["sigterm_to_the_launcher", "ctrl_c_to_the_group", "sigterm_to_a_learner"],
)
def test_a_stop_signal_stops_the_learners_cleanly_and_is_the_runs_status(
    tmp_path, name, status, to
):
    """A Ctrl-C ended the run with 143 and "stopped by SIGTERM": the launcher forwarded SIGTERM,
    and the chief learner reported the forwarded signal. A SIGTERM to one learner ended the
    run with status 0, as if it had finished, so `train && eval` went on."""
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", "--gin_file=catch_a3c.gin",
         "--gin_bindings=RunConfig.total_frames = 100_000_000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (tmp_path / "metrics.csv").exists():
        time.sleep(0.2)
    learners = descendants(process.pid)
    if to == "launcher":
        process.send_signal(signal.SIGTERM)
    elif to == "group":
        os.killpg(process.pid, signal.SIGINT)
    else:  # its lock (made, then written) names the launcher, which a second command names
        lock, holder, text = tmp_path / "learner-1" / ".lock", None, ""
        while holder is None and time.monotonic() < deadline:
            text = lock.read_text() if lock.exists() else ""
            holder = re.match(rf"pid {process.pid}: .*; its learner pid (\d+)$", text.strip())
            time.sleep(0.2)
        assert holder, f"learner 1's lock does not name the launcher, then itself: {text!r}"
        os.kill(int(holder.group(1)), signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == status, err[-3000:]
    said = f"stopped by {name}" if to != "learner-1" else "stopped with another process of the run"
    assert said in out and "checkpoint saved" in out, out[-2000:]
    assert "SIGTERM" not in out or name == "SIGTERM", out[-2000:]
    assert "leaked" not in err  # the launcher released its locks, not the resource tracker
    deadline = time.monotonic() + 30  # a process may still be on its way out
    while any(state(pid) not in ("", "Z") for pid in learners) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in learners if state(pid) not in ("", "Z")], "processes left"
    assert not shm.left_by(process.pid, *learners)
    assert 0 < int(rows(tmp_path)[-1]["env_frames"]) < 100_000_000


def semaphores() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sem.")}


@pytest.mark.serial  # counts the machine's named semaphores, which any test's processes make
def test_a_sigkill_of_the_whole_group_leaves_no_semaphore_and_the_next_run_sweeps_the_store(
    tmp_path,
):
    from tfaccel import launcher

    before = semaphores()
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", "--gin_file=catch_a3c.gin",
         "--gin_bindings=RunConfig.total_frames = 100_000_000"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "metrics.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # both learners attached to the store and trained
    assert process.poll() is None, process.stderr.read()[-3000:]
    group = [process.pid, *descendants(process.pid)]
    os.killpg(process.pid, signal.SIGKILL)  # the launcher, its learners and their env workers
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(state(pid) not in ("", "Z") for pid in group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in group if state(pid) not in ("", "Z")], "processes left"
    # Locks are byte ranges of the store's file and results come back on pipes: no named
    # semaphore (multiprocessing's Lock, Event, Queue) is left behind for good.
    assert semaphores() - before == set()
    left = shm.left_by(*group)
    assert [name for name in left if name.startswith("tfaccel-ps-")], left  # nobody unlinked it
    assert set(launcher.sweep_dead_stores()) >= {n for n in left if n.startswith("tfaccel-ps-")}
    assert not shm.left_by(*group)


def test_ctrl_c_while_the_learners_start_is_a_stop_not_a_failure(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", "--gin_file=catch_a3c.gin"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(descendants(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the learners are spawned: they load Python and TensorFlow now
    learners = descendants(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "stopped by SIGINT" in out and "Traceback" not in err, (out, err[-3000:])
    deadline = time.monotonic() + 30
    while any(state(pid) not in ("", "Z") for pid in learners) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in learners if state(pid) not in ("", "Z")], "processes left"
    assert not shm.left_by(process.pid, *learners)


def test_sigterm_while_a_machines_learner_starts_is_a_stop_there_and_a_named_end_elsewhere(
    tmp_path,
):
    machines = start_machines(
        tmp_path, "RunConfig.total_frames = 10_000_000", "make_strategy.timeout_seconds = 20"
    )
    deadline = time.monotonic() + 120
    while len(descendants(machines[0].pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the resource tracker, then the learner: it loads TensorFlow now
    learners = descendants(machines[0].pid)
    machines[0].send_signal(signal.SIGTERM)  # forwarded to the learner, before it holds signals
    out, err = machines[0].communicate(timeout=120)
    assert machines[0].returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in out, (out, err[-3000:])
    # Machine 1 waited for machine 0's first round in vain and says so in one line.
    _, err = machines[1].communicate(timeout=240)
    assert machines[1].returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: a worker of the multi-worker run stopped answering"), last
    assert not [pid for pid in learners if state(pid) not in ("", "Z")], "processes left"
    assert not shm.left_by(*[machine.pid for machine in machines], *learners)
