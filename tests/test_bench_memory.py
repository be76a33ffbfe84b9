"""tfaccel.bench.memory's figures of a process tree and benchmarks/run_memory.py, which sums
them over a training run's processes."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfaccel.bench import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import run_memory  # noqa: E402


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_pss_counts_this_process_and_grows_with_what_it_touches():
    before = memory.pss_mib(os.getpid())
    assert 0 < before <= memory.rss_mib(os.getpid()) + 1
    block = np.ones(64 << 20, np.uint8)  # 64 MiB, every page written
    assert memory.pss_mib(os.getpid()) >= before + 60
    del block
    assert memory.pss_mib(_gone_pid()) == 0 and memory.rss_mib(_gone_pid()) == 0


def test_a_sample_sums_the_trainer_and_every_process_below_it(tmp_path):
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(100):  # until the grandchild runs
            if memory.descendants(parent.pid):
                break
            subprocess.run(["sleep", "0.05"])
        tree = [parent.pid] + memory.descendants(parent.pid)
        figures = run_memory.sample(parent.pid)
        assert figures["processes"] == len(tree) == 2
        assert figures["rss_mib"] == pytest.approx(sum(memory.rss_mib(p) for p in tree), rel=0.2)
        assert 0 < figures["pss_mib"] <= figures["rss_mib"] + 1
        (tmp_path / ".lock").write_text(f"pid {parent.pid}: train --gin_file=a2c.gin")
        assert run_memory.trainer_pid(str(tmp_path)) == parent.pid
    finally:
        for pid in memory.descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_a_run_directory_without_a_live_trainer_is_named_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no .lock naming a pid"):
        run_memory.trainer_pid(str(tmp_path))
    (tmp_path / ".lock").write_text(f"pid {_gone_pid()}: train --gin_file=a2c.gin")
    with pytest.raises(SystemExit, match="is not running"):
        run_memory.trainer_pid(str(tmp_path))


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
