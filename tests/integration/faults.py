"""A fault-injection harness: a training command is started, struck at a named moment, and
then held to what docs/troubleshooting.md promises.

A `Fault` names the moment (`Moment`: a file appears in the run directory, or the log reaches a
frame count), the blow (SIGKILL to the trainer or to its whole process group, a SIGSTOP for some
seconds, a SIGKILL of one env worker, a file-size limit that fills the disk) and the run it
strikes. `strike` runs it; `check_recovery` then asserts:

- no process of the struck run is left (env workers, learners) and none of its /dev/shm files;
- no partial file is left in the run directory (`*_temp*`, `*.partial*`);
- the same command resumes, from a checkpoint at most one checkpoint interval (and one row)
  behind what had been logged when the blow fell, and trains to its end;
- every frame count is logged once: metrics.csv's frames strictly increase.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from tests import shm
from tests.integration.commands import ROOT, logged_frames, rows, train
from tfaccel.bench.memory import descendants, state
from tfaccel.envs.worker import WORKER_NAME


@dataclasses.dataclass(frozen=True)
class Moment:
    """When a blow falls: `ready(run_dir)` turns True (polled every 20 ms)."""

    name: str
    ready: Callable[[str], bool]


def file_appears(pattern: str) -> Moment:
    """The moment a file matching `pattern` (a glob below the run directory) exists."""
    return Moment(
        f"{pattern} appears", lambda run_dir: bool(glob.glob(os.path.join(run_dir, pattern)))
    )


def frames_logged(frames: int) -> Moment:
    """The moment metrics.csv holds a row at `frames` or more (between checkpoints)."""
    return Moment(f"{frames:,} frames logged", lambda run_dir: logged_frames(run_dir) >= frames)


@dataclasses.dataclass(frozen=True)
class Fault:
    """A blow at a moment of a run.

    Attributes:
        moment: when it falls.
        blow: `kill` (SIGKILL to the trainer), `kill_group` (SIGKILL to its process group),
            `stop` (SIGSTOP to the trainer for `seconds`, then SIGCONT: a starved machine),
            `kill_worker` (SIGKILL to one env worker), or `disk_full` (the run is started
            again under a file-size limit of `limit_mib`, which its next checkpoint exceeds).
        args: the command's arguments after --root_dir.
        interval: the run's checkpoint interval in env frames.
        seconds: how long a `stop` lasts.
        limit_mib: the file-size limit of `disk_full`.
    """

    moment: Moment
    blow: str
    args: tuple[str, ...]
    interval: int
    seconds: float = 5.0
    limit_mib: int = 4


@dataclasses.dataclass
class Struck:
    """What `strike` saw: the frames logged when the blow fell, the processes of the run, and the
    struck command's end (None while it still runs, for blows it survives)."""

    logged: int
    pids: list[int]
    returncode: int | None
    stderr: str


def strike(run_dir: str, fault: Fault, timeout: float = 240) -> Struck:
    """Starts `bin/train` on `run_dir` with `fault.args` (in a process group of its own), waits
    for the moment, strikes, and returns when the struck command has ended."""
    if fault.blow == "disk_full":
        return _disk_full(run_dir, fault, timeout)
    process = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={run_dir}", *fault.args],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        pids = _wait_for(process, run_dir, fault.moment, timeout)
        logged = logged_frames(run_dir)
        _blow(process, fault, pids)
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return Struck(logged, pids, process.returncode, err)


def _wait_for(process, run_dir: str, moment: Moment, timeout: float) -> list[int]:
    deadline, pids = time.monotonic() + timeout, set()
    while not moment.ready(run_dir):
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {moment.name}: {process.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {moment.name} in {timeout} s")
        pids |= set(descendants(process.pid))
        time.sleep(0.02)
    return sorted({process.pid, *pids, *descendants(process.pid)})


def _blow(process, fault: Fault, pids: list[int]) -> None:
    if fault.blow == "kill":
        process.kill()
    elif fault.blow == "kill_group":
        os.killpg(process.pid, signal.SIGKILL)
    elif fault.blow == "stop":
        process.send_signal(signal.SIGSTOP)
        time.sleep(fault.seconds)
        process.send_signal(signal.SIGCONT)
    elif fault.blow == "kill_worker":
        workers = [pid for pid in descendants(process.pid) if _name(pid).startswith(WORKER_NAME)]
        assert workers, "no env worker to kill"
        os.kill(workers[0], signal.SIGKILL)
    else:
        raise ValueError(f"unknown blow {fault.blow!r}")


def _disk_full(run_dir: str, fault: Fault, timeout: float) -> Struck:
    """A first run to its end, then the same command on a longer run under a file-size limit
    that its next checkpoint exceeds (a full disk, as the process sees it)."""
    first = train(run_dir, *fault.args, timeout=timeout)
    assert first.returncode == 0, first.stderr[-3000:]
    total = logged_frames(run_dir)

    def quota():
        limit = fault.limit_mib << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={run_dir}", *fault.args,
         f"--gin_bindings=RunConfig.total_frames = {total + 2 * fault.interval}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=quota,
    ) as full:  # fmt: skip
        pids = [full.pid]
        while full.poll() is None:
            pids = sorted({*pids, *descendants(full.pid)})
            time.sleep(0.05)
        err = full.stderr.read()
    return Struck(total, pids, full.returncode, err)


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def check_recovery(run_dir: str, fault: Fault, struck: Struck, more_frames: int) -> str:
    """Asserts the promises of the module docstring after `struck`; resumes the run for
    `more_frames` past what was logged and returns the resumed command's output."""
    deadline = time.monotonic() + 30  # workers notice their trainer is gone
    while any(state(pid) not in ("", "Z") for pid in struck.pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in struck.pids if state(pid) not in ("", "Z")], "processes left"
    assert not shm.left_by(*struck.pids), "shared memory left"
    target = logged_frames(run_dir) + more_frames
    resumed = train(run_dir, *fault.args, f"--gin_bindings=RunConfig.total_frames = {target}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    partial = [
        path for path in glob.glob(os.path.join(run_dir, "**", "*"), recursive=True)
        if "_temp" in os.path.basename(path) or ".partial" in os.path.basename(path)
    ]  # fmt: skip
    assert not partial, partial
    if "resumed from" in resumed.stdout:
        line = next(line for line in resumed.stdout.splitlines() if "resumed from" in line)
        saved = int(line.split(" at ")[1].split(" frames")[0].replace(",", ""))
        log_interval = _log_interval(run_dir)
        # At most one checkpoint interval lost (and the row being written).
        assert saved >= struck.logged - fault.interval - log_interval, (line, struck.logged)
    else:
        assert struck.logged <= fault.interval, resumed.stdout  # struck before any checkpoint
    frames = [int(row["env_frames"]) for row in rows(run_dir)]
    assert frames == sorted(set(frames)), frames  # each frame count logged once
    assert frames[-1] >= target
    return resumed.stdout


def _log_interval(run_dir: str) -> int:
    frames = [int(row["env_frames"]) for row in rows(run_dir)]
    return max((b - a for a, b in zip(frames, frames[1:], strict=False)), default=0)
