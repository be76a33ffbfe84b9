#!/usr/bin/env python3
"""End-to-end A2C training throughput on Pong for the layouts and settings of the README table.

    .venv/bin/python benchmarks/training_throughput.py --json=benchmarks/results/training_throughput.json

Each variant runs bin/train with a2c.gin for 12 s of warm-up plus 20 s, in a fresh process. The
limit (one process stepping one Pong env with random actions, times the cores) is measured in the
same run, before and after the variants; rows report agent steps/s and the ratio to its median.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfaccel.bench.end_to_end import training_sps  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402
from tfaccel.bench.sampler import raw_single_process_sps  # noqa: E402
from tfaccel.envs.atari import AtariConfig  # noqa: E402

VARIANTS = {
    "64 envs (4 x 16, two groups), nice 19 (a2c.gin)": (4, 16, ()),
    "64 envs (4 x 16, two groups), nice 5": (4, 16, ("train.worker_niceness = 5",)),
    "32 envs (2 x 16, one group)": (2, 16, ("train.num_groups = 1",)),
    "32 envs (2 x 16, two groups)": (2, 16, ()),
    "64 envs (4 x 16), tf_threads 1": (4, 16, ("train.tf_threads = 1",)),
    "64 envs (4 x 16, two groups), nice 19, mixed_bfloat16": (
        4,
        16,
        ("set_precision.policy = 'mixed_bfloat16'",),
    ),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    raws = [raw_single_process_sps(AtariConfig(), 10.0)]
    results = []
    for name, (workers, per_worker, bindings) in VARIANTS.items():
        row = training_sps(
            "pong", workers, per_worker, args.seconds, warmup=12, extra_bindings=bindings
        )
        results.append(dict(row, variant=name))
        print(
            f"{name:50s} {row['sps']:7.0f} steps/s  env {row['env_fraction']:.0%} "
            f"inference {row['inference_fraction']:.0%} learning {row['learn_fraction']:.0%}",
            flush=True,
        )
    raws.append(raw_single_process_sps(AtariConfig(), 10.0))
    limit = statistics.median(raws) * cpus
    print(f"limit: {limit:,.0f} steps/s ({cpus} cores; single process {raws})")
    for row in results:
        row["x_limit"] = row["sps"] / limit
        print(f"{row['variant']:50s} {row['x_limit']:.3f} x limit")
    if args.json:
        write_json(args.json, {"limit_sps": limit, "raw_single_process": raws, "results": results})


if __name__ == "__main__":
    main()
