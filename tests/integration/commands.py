"""Runs bin/train as a user does, and reads what a run writes: shared by the integration tests."""

import csv
import os
import subprocess
import sys

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


# Columns of metrics.csv that measure time or memory, not learning: they differ between runs.
TIMING = {"wall_s", "fps", "replay_wait_fraction", "peak_rss_mib"} | {
    f"{part}_fraction" for part in ("env", "inference", "learn")
}
