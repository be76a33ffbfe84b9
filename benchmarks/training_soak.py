#!/usr/bin/env python3
"""A training run watched for leaks: resident memory, /dev/shm and zombies over its lifetime.

A2C with 64 envs for 30 minutes (the long-run soak):

    .venv/bin/python benchmarks/training_soak.py --name=a2c --minutes=30 \
        --gin_file=a2c.gin --gin_bindings="PoolConfig.num_workers = 4" \
        --gin_bindings="PoolConfig.envs_per_worker = 16"

A replay run through the moment its buffer fills (C51 with a 200k-transition replay):

    .venv/bin/python benchmarks/training_soak.py --name=c51 --minutes=30 \
        --gin_file=categorical_dqn.gin --gin_bindings="train_off_policy.replay_capacity = 200_000"

Memory is the resident set (VmRSS) of the trainer plus every process below it, sampled every
`--interval` seconds. Growth is measured from the first sample after the warm-up (a quarter of
the run, and for a replay run not before its buffer is full, read from metrics.csv) to the last.
After the run: /dev/shm must be back to its size before, and no process of the run may be left.
Writes `benchmarks/results/soak/training_soak__<name>.{json,png,log}` (the log is the trainer's
output).
"""

import argparse
import csv
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench.memory import (  # noqa: E402
    descendants,
    plot_memory,
    rss_mib,
    shm_used_mib,
    state,
)
from tfaccel.bench.results import write_json  # noqa: E402


def replay_full_at(run_dir: str, capacity: int) -> float | None:
    """Wall seconds of the first metrics.csv row whose replay is full: it holds 99% of
    `capacity` transitions (the steps of each env whose n-step window is still open are not
    counted as stored, so a full replay stays a little under its capacity)."""
    path = os.path.join(run_dir, "metrics.csv")
    if not capacity or not os.path.exists(path):
        return None
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("replay_size") and int(row["replay_size"]) >= 0.99 * capacity:
                return float(row["wall_s"])
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the results' variant name, e.g. a2c")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--gin_file", action="append", default=[])
    parser.add_argument("--gin_bindings", action="append", default=[])
    parser.add_argument("--run_dir", default=None, help="default: /tmp/tfaccel_<name>")
    args = parser.parse_args()
    run_dir = args.run_dir or f"/tmp/tfaccel_{args.name}"
    capacity = next(
        (
            int(b.split("=")[1].replace("_", ""))
            for b in args.gin_bindings
            if "replay_capacity" in b
        ),
        0,
    )
    command = [sys.executable, "bin/train", f"--root_dir={run_dir}"]
    command += [f"--gin_file={name}" for name in args.gin_file]
    command += [f"--gin_bindings={binding}" for binding in args.gin_bindings]
    command += [f"--gin_bindings=RunConfig.max_wall_seconds = {args.minutes * 60}"]
    shm_before = shm_used_mib()
    begin = time.perf_counter()
    out = os.path.join(ROOT, "benchmarks", "results", "soak", f"training_soak__{args.name}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    log_path = f"{out}.log"
    with open(log_path, "w") as log:
        trainer = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        samples, seen = [], set()
        while trainer.poll() is None:
            tree = descendants(trainer.pid)
            seen.update(tree)
            samples.append(
                {
                    "t": time.perf_counter() - begin,
                    "rss_mib": rss_mib(trainer.pid) + sum(rss_mib(pid) for pid in tree),
                    "shm_mib": shm_used_mib(),
                    "processes": 1 + len(tree),
                    "zombies": sum(state(pid) == "Z" for pid in tree),
                }
            )
            time.sleep(args.interval)
    time.sleep(5)  # the workers exit once the trainer is gone
    left = sorted(pid for pid in seen if state(pid) not in ("", "Z"))
    full_at = replay_full_at(run_dir, capacity)
    warm = max(args.minutes * 60 / 4, full_at or 0.0)
    settled = [s for s in samples if s["t"] >= warm] or samples[-1:]
    growth = settled[-1]["rss_mib"] / settled[0]["rss_mib"] - 1
    result = {
        "name": args.name,
        "train_command": " ".join(command),
        "exit_code": trainer.returncode,
        "minutes": args.minutes,
        "replay_capacity": capacity,
        "replay_full_at_s": full_at,
        "rss_mib_after_warmup": settled[0]["rss_mib"],
        "rss_mib_at_end": settled[-1]["rss_mib"],
        "rss_growth_after_warmup": growth,
        "max_zombies": max(s["zombies"] for s in samples),
        "shm_mib_before": shm_before,
        "shm_mib_after": shm_used_mib(),
        "processes_left": left,
        "samples": samples,
    }
    write_json(f"{out}.json", result)
    print(
        f"{args.name}: exit {trainer.returncode}; RSS {settled[0]['rss_mib']:.0f} -> "
        f"{settled[-1]['rss_mib']:.0f} MiB ({growth:+.1%}) after {warm:.0f} s; zombies at most "
        f"{result['max_zombies']}; /dev/shm {shm_before:.1f} -> {result['shm_mib_after']:.1f} "
        f"MiB; processes left: {left or 'none'}"
    )
    plot_memory(
        f"{out}.png",
        samples,
        {"RSS, trainer + workers": "rss_mib", "/dev/shm used": "shm_mib"},
        f"{args.name}: {growth:+.1%} RSS after warm-up",
        mark=(warm, "growth measured from here"),
    )


if __name__ == "__main__":
    main()
