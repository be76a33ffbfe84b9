#!/usr/bin/env python3
"""The memory a training run takes, sampled while it trains (for a config's RAM figure).

Watch a run that is training, until it ends or for `--minutes`:

    .venv/bin/python benchmarks/run_memory.py --run_dir=runs/suite/appo/breakout/seed1 \
        --name=appo_breakout --minutes=90 --interval=20

The trainer is the process that holds the run directory's `.lock` (the pid the lock names);
every `--interval` seconds the script sums two figures over the trainer and every process below
it (learners, env workers): the resident set (RSS, which counts a library shared by two
processes twice) and the proportional set (PSS, which counts it once: what the run takes from
the machine). The peak of each, with the samples, whether the run ended while watched and the
frames it trained meanwhile, goes to `benchmarks/results/memory/<name>.{json,png}` (`--out_dir`).
Replay runs grow until their buffer is full: watch them past that moment (`replay_fill` in
metrics.csv).
"""

import argparse
import csv
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench.memory import descendants, plot_memory, pss_mib, rss_mib, state  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402

LOCK = ".lock"  # tfaccel.run_dir.LOCK; importing that module would load TensorFlow here


def _held(path: str) -> bool:
    """Whether some process holds the `flock` of `path` (a trainer holds its lock until it
    exits, so a lock nobody holds is a run that ended, whatever pid its text names)."""
    import fcntl

    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)  # dropped again by the close
    except BlockingIOError:
        return True
    except OSError:  # a filesystem without locks: trust the pid
        return True
    finally:
        os.close(descriptor)
    return False


def trainer_pid(run_dir: str) -> tuple[int, str]:
    """The pid that `run_dir`'s lock names (`pid N: ...`) while a live process holds it, and
    the lock's text (the trainer's command)."""
    path = os.path.join(run_dir, LOCK)
    try:
        with open(path) as lock:
            text = lock.read().strip()
        pid = int(text.split()[1].rstrip(":"))
    except (FileNotFoundError, IndexError, ValueError):
        raise SystemExit(
            f"error: {run_dir} has no {LOCK} naming a pid: is a run training there?"
        ) from None
    if not _held(path) or state(pid) in ("", "Z"):
        raise SystemExit(f"error: no run is training in {run_dir}: the one its {LOCK} names "
                         f"({text}) has ended")  # fmt: skip
    return pid, text


def sample(pid: int) -> dict:
    """RSS and PSS summed over `pid` and its descendants, in MiB, and how many processes."""
    tree = [pid] + descendants(pid)
    return {
        "rss_mib": sum(rss_mib(p) for p in tree),
        "pss_mib": sum(pss_mib(p) for p in tree),
        "processes": len(tree),
    }


def frames_so_far(run_dir: str) -> int:
    """The env frames of the last row of `run_dir`'s metrics.csv (0 before the first)."""
    try:
        with open(os.path.join(run_dir, "metrics.csv")) as handle:
            rows = list(csv.DictReader(handle))
        return int(float(rows[-1]["env_frames"])) if rows else 0
    except (FileNotFoundError, KeyError, ValueError):
        return 0


def watch(pid: int, minutes: float, interval: float) -> tuple[list[dict], bool]:
    """Samples of `pid`'s tree every `interval` s for `minutes`, and whether it ended first.
    A sample taken while the trainer ended (gone, or a zombie not yet reaped) is dropped."""
    begin, samples = time.perf_counter(), []
    while time.perf_counter() - begin < minutes * 60:
        figures = sample(pid)
        if state(pid) in ("", "Z"):
            return samples, True
        if figures["rss_mib"] > 0 and figures["pss_mib"] == 0:
            raise SystemExit(
                f"error: the kernel gives no PSS for pid {pid} (/proc/{pid}/smaps_rollup is "
                "missing or unreadable: another user's process, or a kernel before 4.14)"
            )
        samples.append(dict(figures, t=round(time.perf_counter() - begin, 1)))
        time.sleep(interval)
    return samples, False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True, help="a run directory whose run is training")
    parser.add_argument("--name", required=True, help="the results' name, e.g. appo_breakout")
    parser.add_argument("--minutes", type=float, default=30, help="stop watching after this")
    parser.add_argument("--interval", type=float, default=15, help="seconds between samples")
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "benchmarks", "results", "memory"))
    args = parser.parse_args(argv)
    pid, trainer = trainer_pid(args.run_dir)
    first_frames = frames_so_far(args.run_dir)
    samples, ended = watch(pid, args.minutes, args.interval)
    if not samples:
        raise SystemExit("error: the run ended before the first sample")
    peak = {key: max(s[key] for s in samples) for key in ("rss_mib", "pss_mib", "processes")}
    out = os.path.join(args.out_dir, args.name)
    os.makedirs(args.out_dir, exist_ok=True)
    write_json(
        f"{out}.json",
        {"run_dir": args.run_dir, "trainer": trainer, "ended_while_watched": ended,
         "env_frames_watched": [first_frames, frames_so_far(args.run_dir)],
         **{f"peak_{k}": v for k, v in peak.items()}, "samples": samples},
    )  # fmt: skip
    print(
        f"{args.name}: peak {peak['pss_mib']:,.0f} MiB PSS, {peak['rss_mib']:,.0f} MiB RSS over "
        f"{peak['processes']} processes ({len(samples)} samples, {samples[-1]['t'] / 60:.0f} min, "
        f"{'to the end of the run' if ended else 'the run goes on'})"
    )
    plot_memory(
        f"{out}.png",
        samples,
        {"RSS, summed": "rss_mib", "PSS, summed": "pss_mib"},
        f"{args.name}: peak {peak['pss_mib']:,.0f} MiB PSS",
    )


if __name__ == "__main__":
    main()
