#!/usr/bin/env python3
"""Overhead of MirroredStrategy on one device against no strategy: the time of one
A2C update of the paper's network on Pong-sized batches, interleaved repeats, median.

    .venv/bin/python benchmarks/strategy_overhead.py --json=benchmarks/results/speed/strategy_overhead.json

Target: `mirrored` on one device within 5% of no strategy at batch >= 256 on CPU.
"""

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def rollout(envs: int, seed: int = 0):
    from tfaccel.types import Rollout

    rng = np.random.default_rng(seed)
    shape = (5, envs)
    return Rollout(
        observation=rng.integers(0, 256, (*shape, 104, 80, 4), dtype=np.uint8),
        action=rng.integers(0, 6, shape, dtype=np.int32),
        reward=rng.choice([-1.0, 0.0, 1.0], shape).astype(np.float32),
        terminated=np.zeros(shape, bool),
        truncated=np.zeros(shape, bool),
        truncation_value=np.zeros(shape, np.float32),
        log_prob=np.zeros(shape, np.float32),
        value=np.zeros(shape, np.float32),
        bootstrap_observation=rng.integers(0, 256, (envs, 104, 80, 4), dtype=np.uint8),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import tensorflow as tf

    from tfaccel import learner, networks
    from tfaccel.algorithms import a2c
    from tfaccel.bench import results as results_file
    from tfaccel.types import ArraySpec, EnvSpec, Rollout

    spec = EnvSpec(ArraySpec((104, 80, 4), np.dtype(np.uint8)), 6)
    config = a2c.A2CConfig(max_grad_norm=0.5)
    strategies = {
        "none": tf.distribute.get_strategy(),
        "mirrored, one device": tf.distribute.MirroredStrategy(["/cpu:0"]),
    }
    rows = []
    for envs in (64, 128):  # batches of 320 and 640 samples (5 steps x envs)
        agents = {
            name: learner.Learner(
                lambda: networks.PolicyValueNetwork(spec),
                lambda n, b: a2c.loss(n, b, config),
                lambda: learner.make_rmsprop(7e-4, epsilon=1e-5),
                max_grad_norm=0.5,
                strategy=strategy,
                batch_axes=Rollout.env_axes(),
            )  # fmt: skip
            for name, strategy in strategies.items()
        }
        batch = rollout(envs)
        times = {name: [] for name in agents}
        for agent in agents.values():
            agent.train(batch)  # trace
        for _ in range(args.repeats):
            for name, agent in agents.items():  # interleaved: drift hits both alike
                tick = time.perf_counter()
                agent.train(batch)
                times[name].append(time.perf_counter() - tick)
        medians = {name: float(np.median(t) * 1e3) for name, t in times.items()}
        ratio = medians["mirrored, one device"] / medians["none"]
        rows.append({"batch": 5 * envs, "ms": medians, "mirrored_over_none": ratio})
        print(
            f"batch {5 * envs}: no strategy {medians['none']:.1f} ms, mirrored on one device "
            f"{medians['mirrored, one device']:.1f} ms ({ratio:.3f}x)",
            flush=True,
        )
    if args.json:
        results_file.write_json(args.json, {"results": rows})


if __name__ == "__main__":
    main()
