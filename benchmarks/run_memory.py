#!/usr/bin/env python3
"""The memory a training run takes, sampled while it trains (for a config's RAM figure).

Watch a run that is training, until it ends or for `--minutes`:

    .venv/bin/python benchmarks/run_memory.py --run_dir=runs/suite/appo/breakout/seed1 \
        --name=appo_breakout --minutes=40

The trainer is the pid in the run directory's `.lock`; every `--interval` seconds the script
sums two figures over the trainer and every process below it (learners, env workers): the
resident set (RSS, which counts a library shared by two processes twice) and the proportional
set (PSS, which counts it once: what the run takes from the machine). The peak of each, with
the samples, goes to `benchmarks/results/memory/<name>.{json,png}`. Replay runs grow until
their buffer is full: watch them past that moment (`replay_fill` in metrics.csv).
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench.memory import descendants, plot_memory, pss_mib, rss_mib  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402

LOCK = ".lock"  # tfaccel.run_dir.LOCK; importing that module would load TensorFlow here


def trainer_pid(run_dir: str) -> int:
    """The pid `run_dir`'s lock names (`pid N: ...`), if that process is alive."""
    try:
        with open(os.path.join(run_dir, LOCK)) as lock:
            words = lock.read().split()
        pid = int(words[1].rstrip(":"))
    except (FileNotFoundError, IndexError, ValueError):
        raise SystemExit(
            f"error: {run_dir} has no {LOCK} naming a pid: is a run training there?"
        ) from None
    if not os.path.exists(f"/proc/{pid}"):
        raise SystemExit(f"error: the pid {pid} in {run_dir}/{LOCK} is not running")
    return pid


def sample(pid: int) -> dict:
    """RSS and PSS summed over `pid` and its descendants, in MiB, and how many processes."""
    tree = [pid] + descendants(pid)
    return {
        "rss_mib": sum(rss_mib(p) for p in tree),
        "pss_mib": sum(pss_mib(p) for p in tree),
        "processes": len(tree),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True, help="a run directory whose run is training")
    parser.add_argument("--name", required=True, help="the results' name, e.g. appo_breakout")
    parser.add_argument("--minutes", type=float, default=30, help="stop watching after this")
    parser.add_argument("--interval", type=float, default=15, help="seconds between samples")
    args = parser.parse_args()
    pid = trainer_pid(args.run_dir)
    with open(os.path.join(args.run_dir, LOCK)) as lock:
        trainer = lock.read().strip()
    begin, samples = time.perf_counter(), []
    while os.path.exists(f"/proc/{pid}") and time.perf_counter() - begin < args.minutes * 60:
        samples.append(dict(sample(pid), t=round(time.perf_counter() - begin, 1)))
        time.sleep(args.interval)
    if not samples:
        raise SystemExit("error: the run ended before the first sample")
    peak = {key: max(s[key] for s in samples) for key in ("rss_mib", "pss_mib", "processes")}
    out = os.path.join(ROOT, "benchmarks", "results", "memory", args.name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json(
        f"{out}.json",
        {"run_dir": args.run_dir, "trainer": trainer, **{f"peak_{k}": v for k, v in peak.items()},
         "samples": samples},
    )  # fmt: skip
    print(
        f"{args.name}: peak {peak['pss_mib']:,.0f} MiB PSS, {peak['rss_mib']:,.0f} MiB RSS over "
        f"{peak['processes']} processes ({len(samples)} samples, {samples[-1]['t'] / 60:.0f} min)"
    )
    plot_memory(
        f"{out}.png",
        samples,
        {"RSS, summed": "rss_mib", "PSS, summed": "pss_mib"},
        f"{args.name}: peak {peak['pss_mib']:,.0f} MiB PSS",
    )


if __name__ == "__main__":
    main()
