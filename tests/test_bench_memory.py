"""tfaccel.bench.memory's figures of a process tree and benchmarks/run_memory.py, which sums
them over a training run's processes."""

import json
import os
import subprocess
import sys
import time

import pytest

from tfaccel import run_dir
from tfaccel.bench import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import run_memory  # noqa: E402

# A process that writes 64 MiB, then forks a child that forks a grandchild: the three share
# the block's pages (copy-on-write, never written again) and sleep.
SHARED_BLOCK_TREE = """
import os, time
block = bytearray(b"\\x01") * (64 << 20)
if os.fork() == 0:
    os.fork()
time.sleep(60)
"""


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _wait_for_descendants(pid: int, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(memory.descendants(pid)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the block is written before the first fork


def _kill_tree(process: subprocess.Popen) -> None:
    for pid in memory.descendants(process.pid):
        os.kill(pid, 9)
    process.kill()
    process.wait()


def test_a_sample_counts_the_whole_tree_and_shared_pages_once_in_pss():
    tree = subprocess.Popen([sys.executable, "-c", SHARED_BLOCK_TREE])
    try:
        _wait_for_descendants(tree.pid, 2)
        figures = run_memory.sample(tree.pid)
        assert figures["processes"] == 3  # the grandchild too
        assert figures["rss_mib"] >= 3 * 64  # each resident set holds the block
        assert 64 <= figures["pss_mib"] <= figures["rss_mib"] - 2 * 60  # PSS: the block once
        assert memory.pss_mib(tree.pid) < memory.rss_mib(tree.pid) - 30  # a third of it each
    finally:
        _kill_tree(tree)
    assert memory.pss_mib(_gone_pid()) == 0 and memory.rss_mib(_gone_pid()) == 0


def test_the_trainer_is_the_live_holder_of_the_run_directory_lock(tmp_path):
    directory = str(tmp_path)
    with pytest.raises(SystemExit, match="no .lock naming a pid"):
        run_memory.trainer_pid(directory)
    run_dir.take_lock(directory)  # as a trainer does: its pid and command
    try:
        pid, text = run_memory.trainer_pid(directory)
        assert pid == os.getpid() and text.startswith(f"pid {pid}: ")
    finally:
        run_dir.release_lock(directory)
    # The file stays and names a live pid (this one, as a reused pid would): nobody holds it.
    with pytest.raises(SystemExit, match="no run is training in .* has ended"):
        run_memory.trainer_pid(directory)


def test_watching_a_run_to_its_end_writes_its_peaks_and_frames(tmp_path):
    directory, out = tmp_path / "run", tmp_path / "out"
    directory.mkdir()
    (directory / "metrics.csv").write_text("env_frames,agent_steps\n1000,250\n")
    holder = (
        "import fcntl, os, time\n"
        f"descriptor = os.open({str(directory / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(descriptor, fcntl.LOCK_EX)\n"
        "os.write(descriptor, f'pid {os.getpid()}: train --gin_file=a2c.gin'.encode())\n"
        "time.sleep(2.5)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", holder])
    try:
        lock, deadline = directory / ".lock", time.monotonic() + 20
        while not (lock.exists() and lock.read_text()):  # written once the flock is held
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run_memory.main(
            [f"--run_dir={directory}", "--name=toy", "--interval=0.2", f"--out_dir={out}"]
        )
    finally:
        trainer.kill()
        trainer.wait()
    result = json.loads((out / "toy.json").read_text())
    assert result["ended_while_watched"] is True
    assert result["env_frames_watched"] == [1000, 1000]
    assert result["peak_processes"] == 1 and 0 < result["peak_pss_mib"] <= result["peak_rss_mib"]
    assert all(s["rss_mib"] > 0 for s in result["samples"])  # none taken as it ended
    assert (out / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_memory_draws_the_named_series_into_a_png(tmp_path):
    samples = [
        {"t": 0.0, "rss_mib": 10.0, "pss_mib": 8.0},
        {"t": 60.0, "rss_mib": 12.0, "pss_mib": 9.0},
    ]
    path = tmp_path / "memory.png"
    memory.plot_memory(
        str(path), samples, {"RSS": "rss_mib", "PSS": "pss_mib"}, "a run", mark=(30, "here")
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KeyError, match="shm_mib"):  # a series the samples lack
        memory.plot_memory(str(path), samples, {"/dev/shm": "shm_mib"}, "a run")
