#!/usr/bin/env python3
"""Q-value training throughput on Pong and how long the learner waits for replay batches.

    .venv/bin/python benchmarks/dqn_throughput.py --json=benchmarks/results/speed/dqn_throughput.json
    .venv/bin/python benchmarks/dqn_throughput.py --only=bfloat16   # the variants named so

Each variant runs bin/train with categorical_dqn.gin (16 envs, batch 32, 8 gradient samples per
agent step) in a fresh process: 2,000 agent steps of warm-up fill the replay, then the learner
trains for the measured seconds. `replay_wait_fraction` is the share of the learner's time spent
waiting for its next batch (target: under 10%).
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402
from tfaccel.bench.end_to_end import select, training_sps  # noqa: E402

COMMON = ("train_off_policy.min_replay_steps = 2_000", "train_off_policy.replay_capacity = 200_000")
VARIANTS = {
    "categorical_dqn.gin, batch 32, prefetch thread": ("categorical_dqn.gin", ()),
    "categorical_dqn.gin, batch 32, no prefetch": (
        "categorical_dqn.gin",
        ("train_off_policy.prefetch = False",),
    ),
    "categorical_dqn.gin, batch 32, mixed_bfloat16": (
        "categorical_dqn.gin",
        ("set_precision.policy = 'mixed_bfloat16'",),
    ),
    "categorical_dqn_b256.gin, batch 256, prefetch thread": ("categorical_dqn_b256.gin", ()),
    "categorical_dqn_b256.gin, batch 256, mixed_bfloat16": (
        "categorical_dqn_b256.gin",
        ("set_precision.policy = 'mixed_bfloat16'",),
    ),
    "rainbow.gin (prioritized, 3-step), prefetch thread": ("rainbow.gin", ()),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--only", default="", help="run only the variants whose name contains this text"
    )
    args = parser.parse_args()
    results = []
    for name, (config, bindings) in select(VARIANTS, args.only).items():
        row = training_sps(
            "pong", 2, 8, args.seconds, config=config, warmup=25.0,
            extra_bindings=COMMON + bindings, trainer="train_off_policy",
            extra_columns=("replay_wait_fraction",),
        )  # fmt: skip
        results.append(dict(row, variant=name))
        print(
            f"{name:55s} {row['sps']:6.0f} steps/s  env {row['env_fraction']:.0%} "
            f"inference {row['inference_fraction']:.0%} learning {row['learn_fraction']:.0%}  "
            f"waiting for replay {row['replay_wait_fraction']:.1%} of learning",
            flush=True,
        )
    if args.json:
        results_file.write_json(
            args.json,
            {"results": results},
        )


if __name__ == "__main__":
    main()
