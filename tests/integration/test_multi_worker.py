"""Two bin/train processes on 127.0.0.1 as one MultiWorkerMirroredStrategy run."""

import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.integration.cluster import start_cluster
from tfaccel.bench.memory import descendants


def start_workers(root_dir, config, *bindings):
    """Starts two workers of `config` + smoke.gin + distribute/multi_worker.gin on 127.0.0.1."""
    return start_cluster(root_dir, [config, "smoke.gin", "distribute/multi_worker.gin"], bindings)


def wait_until_both_train(root_dir, workers):
    """Returns once worker 1 logged its first row (both workers are past the join)."""
    deadline = time.time() + 240
    while not (root_dir / "worker-1" / "metrics.csv").exists():
        assert time.time() < deadline and workers[0].poll() is None, workers[0].stderr.read()
        time.sleep(0.5)


def _sigint_as_a_shell_starts_it(ignored: bool) -> None:
    """In a worker just forked: SIGINT unblocked and default (or ignored, as `cmd &` in a
    script), whatever earlier tests in this pytest process left in the mask and handler that a
    child inherits."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.SIG_DFL)


def trained_values(checkpoint_dir):
    reader = tf.train.load_checkpoint(checkpoint_dir)
    names = sorted(
        name
        for name, _ in tf.train.list_variables(checkpoint_dir)
        if name.startswith(("network/", "optimizer/"))
    )
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.parametrize("config", ["a2c.gin", "rainbow.gin"])
def test_two_workers_train_and_end_with_identical_parameters(tmp_path, config):
    workers = start_workers(tmp_path, config)
    outputs = [worker.communicate(timeout=300) for worker in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err[-3000:]
    chief, other = (
        trained_values(tmp_path / "checkpoints"),
        trained_values(tmp_path / "worker-1" / "checkpoints"),
    )
    assert chief.keys() == other.keys() and len(chief) > 10
    for name, value in chief.items():
        np.testing.assert_array_equal(value, other[name], err_msg=name)
    # frames count both workers' envs; only the chief exports the policy
    last = open(tmp_path / "metrics.csv").read().strip().splitlines()[-1].split(",")
    assert int(last[0]) >= 2000 and int(last[0]) == 4 * int(last[1])
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    assert not (tmp_path / "worker-1" / "policy").exists()


def test_a_dead_worker_ends_the_other_with_one_line(tmp_path):
    workers = start_workers(
        tmp_path,
        "a2c.gin",
        "RunConfig.total_frames = 10_000_000",
        "make_strategy.timeout_seconds = 30",
        # no checkpoint before the kill, however fast the first updates run
        "RunConfig.checkpoint_interval_frames = 10_000_000",
    )
    wait_until_both_train(tmp_path, workers)
    envs = descendants(workers[0].pid)  # the forkserver, and below it the env workers
    assert len(envs) >= 2
    workers[1].send_signal(signal.SIGKILL)
    workers[1].wait()
    _, err = workers[0].communicate(timeout=120)
    assert workers[0].returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: a worker of the multi-worker run stopped answering"), last
    # It stopped before its first checkpoint: no "resume from the last checkpoint" then.
    assert not (tmp_path / "checkpoints" / "checkpoint").exists()
    assert last.endswith("no checkpoint was saved yet: restart every worker with the same command")
    deadline = time.time() + 15  # the forkserver and env workers exit once the trainer is gone
    while any(os.path.exists(f"/proc/{pid}") for pid in envs) and time.time() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in envs if os.path.exists(f"/proc/{pid}")]
    assert not alive, f"processes left behind: {alive}"


def test_a_worker_stopped_by_sigterm_says_so_and_the_chief_stops_with_it(tmp_path):
    """The worker's own console shows why it ended (its log is not shown), with exit status 143;
    the chief ends with it, says so, saves, and exits 0."""
    workers = start_workers(
        tmp_path,
        "a2c.gin",
        "RunConfig.total_frames = 10_000_000",
        "RunConfig.log_interval_frames = 400",
    )
    wait_until_both_train(tmp_path, workers)
    workers[1].send_signal(signal.SIGTERM)
    (chief_out, chief_err), (_, worker_err) = [
        worker.communicate(timeout=120) for worker in workers
    ]
    assert workers[1].returncode == 143, worker_err[-3000:]
    assert "worker 1: stopped by SIGTERM at " in worker_err, worker_err[-3000:]
    assert workers[0].returncode == 0, chief_err[-3000:]
    assert "stopped with another process of the run" in chief_out and "worker 1:" not in chief_err
    assert (tmp_path / "checkpoints" / "checkpoint").exists()


@pytest.mark.parametrize("ignored", [False, True], ids=["sigint", "sigint_ignored"])
def test_ctrl_c_ends_a_worker_that_waits_for_its_peers(tmp_path, ignored):
    """Worker 0 of two, whose peer never starts, waits at TensorFlow's join; Ctrl-C there did
    nothing (the wait holds the interpreter). It now ends at once, as Ctrl-C ends a program;
    a worker started with SIGINT ignored (`cmd &` in a script) keeps ignoring it."""
    import json
    import socket
    import subprocess
    import sys

    from tests.integration.commands import ROOT

    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    worker = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path / 'run'}",
         "--gin_file=catch_a2c.gin", "--gin_file=distribute/multi_worker.gin"],
        cwd=ROOT, env={**os.environ, "TF_CONFIG": config}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: _sigint_as_a_shell_starts_it(ignored),
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while True:  # its server listens: it is at the join, or just before it
            assert worker.poll() is None and time.time() < deadline
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", ports[0])) == 0:
                    break
            time.sleep(0.5)
        time.sleep(3)  # well inside the wait
        worker.send_signal(signal.SIGINT)
        if ignored:
            with pytest.raises(subprocess.TimeoutExpired):
                worker.wait(timeout=5)
        else:
            assert worker.wait(timeout=20) == -signal.SIGINT  # a shell shows 130
    finally:
        worker.kill()
        worker.wait()
    assert not (tmp_path / "run").exists()


def test_a_worker_whose_port_is_taken_says_so_in_one_line(tmp_path):
    """It was TensorFlow's 57-line traceback, 'Could not start gRPC server', naming no port."""
    import json
    import socket
    import subprocess
    import sys

    from tests.integration.commands import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]}
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
        result = subprocess.run(
            [sys.executable, "bin/train", f"--root_dir={tmp_path / 'run'}",
             "--gin_file=catch_a2c.gin", "--gin_file=distribute/multi_worker.gin"],
            cwd=ROOT, env={**os.environ, "TF_CONFIG": config}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: this worker cannot listen on 127.0.0.1:{port} (its entry in the cluster): the "
        "port is taken, by another process or an earlier run still ending; free it or give the "
        "worker another port"
    ]
    assert not (tmp_path / "run").exists()


def test_workers_given_clusters_of_different_sizes_say_so_in_one_line(tmp_path):
    """Each ended with a TensorFlow traceback: "... is joining a group with size3, but that group
    has size 2" [Op:CollectiveBcastSend]."""
    import json
    import socket
    import subprocess
    import sys

    from tests.integration.commands import ROOT

    sockets = [socket.socket() for _ in range(3)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    for sock in sockets:
        sock.close()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "bin/train",
                f"--root_dir={tmp_path / 'run'}",
                "--gin_file=catch_a2c.gin",
                "--gin_file=distribute/multi_worker.gin",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
                ),
            },
        )  # fmt: skip
        for index, cluster in ((0, addresses[:2]), (1, addresses))
    ]
    for process in processes:
        _, err = process.communicate(timeout=180)
        assert process.returncode == 1, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "error: the workers disagree on the run's replicas (2 and 3): give every worker the "
            "same cluster.worker list in TF_CONFIG (with its own task.index) and the same number "
            "of devices"
        )
        assert "Traceback" not in err
