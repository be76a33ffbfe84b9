#!/usr/bin/env python3
"""End-to-end training throughput on Pong: the A2C layouts and settings of the README table, or
K = 1 and 2 asynchronous learners (a3c.gin) against one synchronous learner on the same envs.

    .venv/bin/python benchmarks/training_throughput.py --rounds=3 \
        --json=benchmarks/results/speed/training_throughput.json
    .venv/bin/python benchmarks/training_throughput.py --suite=async --seconds=40 \
        --json=benchmarks/results/speed/training_throughput__async.json

Each variant runs tfaccel-train for a warm-up (12 s; 25 s for the asynchronous suite, whose learners
start one after the other) plus `--seconds`, in a fresh process; agent steps/s count every
learner's envs. The limit (one process stepping one Pong env with random actions, times the
cores) is measured in the same run, before the variants and after each round of them; rows
report agent steps/s and the ratio to the limit, the median over the rounds, and the range. In
the asynchronous suite each learner of a3c.gin has its own 32 envs (2 workers x 16), and the
synchronous rows step as many envs in one learner, with a3c.gin's optimizer.
"""

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfaccel.bench.end_to_end import against_limit, select, training_sps  # noqa: E402

ADAM = ("train.make_optimizer = @make_adam", "train.learning_rate = 3e-4")
SUITES = {  # suite: {name: (config, workers, envs per worker, bindings)}
    "a2c": {
        "64 envs (4 x 16, two groups), nice 19 (a2c.gin)": ("a2c.gin", 4, 16, ()),
        "64 envs (4 x 16, two groups), nice 5": (
            "a2c.gin",
            4,
            16,
            ("PoolConfig.worker_niceness = 5",),
        ),
        "32 envs (2 x 16, one group)": ("a2c.gin", 2, 16, ("PoolConfig.num_groups = 1",)),
        "32 envs (2 x 16, two groups)": ("a2c.gin", 2, 16, ()),
        "64 envs (4 x 16), tf_threads 1": ("a2c.gin", 4, 16, ("RunConfig.tf_threads = 1",)),
        "64 envs (4 x 16, two groups), bf16 (a2c_bf16.gin)": ("a2c_bf16.gin", 4, 16, ()),
        "32 envs (2 x 16, one group), bfloat16": (
            "a2c_bf16.gin",
            2,
            16,
            ("PoolConfig.num_groups = 1",),
        ),
        "32 envs (2 x 16, two groups), bfloat16": ("a2c_bf16.gin", 2, 16, ()),
    },
    "async": {
        "A2C, 1 synchronous learner, 32 envs": ("a2c.gin", 2, 16, ADAM),
        "A3C, K = 1 learner, 32 envs": ("a3c.gin", 2, 16, ("train_async.learners = 1",)),
        "A2C, 1 synchronous learner, 64 envs": ("a2c.gin", 4, 16, ADAM),
        "A3C, K = 2 learners, 2 x 32 envs": ("a3c.gin", 2, 16, ("train_async.learners = 2",)),
    },
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="a2c")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of every variant; rows report the median"
    )
    parser.add_argument(
        "--only", default="", help="run only the variants whose name contains this text"
    )
    args = parser.parse_args()
    warmup = 25.0 if args.suite == "async" else 12.0
    variants = {
        name: functools.partial(
            training_sps,
            "pong",
            workers,
            per_worker,
            args.seconds,
            config=config,
            warmup=warmup,
            extra_bindings=bindings,
        )  # fmt: skip
        for name, (config, workers, per_worker, bindings) in select(
            SUITES[args.suite], args.only
        ).items()
    }
    against_limit(variants, args.json, rounds=args.rounds)


if __name__ == "__main__":
    main()
