"""Where benchmark figures go: JSON with the command, the git revision and the date.

The files and their fields are described in docs/results.md.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_revision() -> str:
    """The short hash of the checked-out commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def first_at_least(values: list, threshold: float) -> int | None:
    """The index of the first value at least `threshold` (None and NaN never are), or None.

    A learning curve's first log row at or above a target score:

    >>> first_at_least([None, -20.0, float("nan"), 5.0, 7.0], 6.0)
    4
    """
    for index, value in enumerate(values):
        if value is not None and value >= threshold:  # NaN >= x is False
            return index
    return None


def frames_to_reach(curve: dict, score: float) -> int | None:
    """The env frames of a curve's first row whose score is at least `score`, or None; `curve`
    is a summary's {"env_frames": [...], "score": [...]} (benchmarks/summarize_run.py).

    >>> frames_to_reach({"env_frames": [1, 2, 3], "score": [None, 5.0, 7.0]}, 6.0)
    3
    """
    index = first_at_least(curve["score"], score)
    return None if index is None else curve["env_frames"][index]


def value_at(frames: list, values: list, at: float):
    """A curve's value after `at` frames: the value of its last row at or before `at`, or None
    when it has no such row or ended before `at` (a run stopped early has no value there).

    >>> value_at([1, 2, 3], [None, 5.0, 7.0], 2)
    5.0
    >>> value_at([1, 2], [4.0, 5.0], 3) is None
    True
    """
    if not frames or frames[-1] < at:
        return None
    before = [value for frame, value in zip(frames, values, strict=True) if frame <= at]
    return before[-1] if before else None


def machine() -> dict:
    """This machine as results name it: the CPU's model (Linux's /proc/cpuinfo; else the
    platform's word for it) and the cores this process may use."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores}


def write_json(path: str, document: dict) -> None:
    """Writes `document` plus `command` (this process's, quoted for a shell), `git_revision`,
    `machine` (see `machine`) and `date` (UTC) to `path`."""
    stamped = dict(
        document,
        command=shlex.join(sys.argv),
        git_revision=git_revision(),
        machine=machine(),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    with open(path, "w") as handle:
        json.dump(stamped, handle, indent=2)
