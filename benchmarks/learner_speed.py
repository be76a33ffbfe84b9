#!/usr/bin/env python3
"""How fast the Q-value learner trains, against what this CPU can compute.

    .venv/bin/python benchmarks/learner_speed.py --json=benchmarks/results/speed/learner_speed.json

Times one compiled C51 update (the Nature CNN on 104x80x4 Pong frames, 6 actions x 51 atoms,
Adam, gradient clipping; `dqn.loss` with its target network) on random batches, for batch 32 and
256 in float32 and mixed bfloat16 (and at 256 with `center_frames`), and reports training
samples/s. The work of one sample is counted from the layer shapes: the online network's forward
pass, its backward pass (twice the forward, less the first convolution's input gradient, which
nothing needs) and the target network's forward pass. The ceiling is a large matrix product in
the same dtype on all cores, timed in the same run: `x peak` is the share of it the update
reaches. First, the optimizer step alone: Keras's Adam against `learner.FusedAdam` on the same
2M parameters.
"""

import argparse
import functools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfaccel import learner, networks  # noqa: E402
from tfaccel.algorithms import dqn  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402
from tfaccel.replay import ReplayBatch  # noqa: E402
from tfaccel.types import ArraySpec, EnvSpec  # noqa: E402

SPEC = EnvSpec(ArraySpec((104, 80, 4), np.dtype(np.uint8)), 6)


def timed(call, seconds: float) -> float:
    """Seconds per call of `call()`, after 3 untimed calls."""
    for _ in range(3):
        call()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls


def matmul_flops(dtype: str, seconds: float, size: int = 2048) -> float:
    """FLOP/s of a [size, size] x [size, size] product in `dtype`."""
    a = tf.random.normal([size, size], dtype=tf.float32)
    a = tf.cast(a, dtype)
    product = tf.function(lambda: tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))
    return 2 * size**3 / timed(lambda: product().numpy(), seconds)


def forward_flops(network: keras.Model) -> tuple[float, float]:
    """FLOPs of one sample's forward pass, and those of the first layer's input gradient."""
    total, first_input_gradient = 0.0, None
    for layer in network.torso.layers + [network.advantage_head]:
        if isinstance(layer, keras.layers.Conv2D):
            _, height, width, channels = layer.output.shape
            kernel = np.prod(layer.kernel.shape[:3])
            flops = 2.0 * height * width * channels * kernel
        elif isinstance(layer, keras.layers.Dense):
            flops = 2.0 * np.prod(layer.kernel.shape)
        else:
            continue
        total += flops
        first_input_gradient = flops if first_input_gradient is None else first_input_gradient
    return total, first_input_gradient


def adam_seconds(optimizer: keras.Optimizer, seconds: float) -> float:
    """Seconds per `apply_gradients` of `optimizer` on the C51 network's 2M parameters."""
    network = networks.QNetwork(SPEC, num_atoms=51)
    variables = network.trainable_variables
    optimizer.build(variables)
    gradients = [tf.random.normal(v.shape, stddev=1e-3) for v in variables]
    apply = tf.function(lambda: optimizer.apply_gradients(zip(gradients, variables, strict=True)))
    return timed(apply, seconds)


def update_seconds(
    batch_size: int, seconds: float, center_frames: bool = False
) -> tuple[float, keras.Model]:
    config = dqn.DQNConfig(num_atoms=51)

    def make_network():
        torso = functools.partial(networks.nature_torso, center_frames=center_frames)
        return networks.QNetwork(SPEC, torso=torso, num_atoms=51)

    agent = learner.Learner(
        make_network,
        lambda network, batch: dqn.loss(network, batch, config, target=agent.target),
        lambda: learner.make_adam(2.5e-4, 0.01 / batch_size),
        max_grad_norm=10.0,
        target_network=True,
    )
    rng = np.random.default_rng(0)
    frames = lambda: rng.integers(0, 256, (batch_size, *SPEC.observation.shape), np.uint8)  # noqa: E731
    batch = ReplayBatch(
        frames(), rng.integers(0, 6, batch_size).astype(np.int32),
        rng.normal(size=batch_size).astype(np.float32), np.full(batch_size, 0.99, np.float32),
        frames(), np.ones(batch_size, np.float32), np.arange(batch_size),
    )  # fmt: skip
    return timed(lambda: agent.train(batch), seconds), agent.network


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    adam = {
        name: adam_seconds(make(2.5e-4, epsilon=3e-4), args.seconds / 3) * 1e3
        for name, make in (("keras", keras.optimizers.Adam), ("fused", learner.FusedAdam))
    }
    print(
        f"Adam on 2M parameters: Keras {adam['keras']:.2f} ms, FusedAdam {adam['fused']:.2f} ms "
        f"({adam['keras'] / adam['fused']:.1f}x)",
        flush=True,
    )
    results = []
    for policy, dtype in (("float32", "float32"), ("mixed_bfloat16", "bfloat16")):
        networks.set_precision(policy)
        peak = matmul_flops(dtype, args.seconds / 3)
        for batch_size, center_frames in ((32, False), (256, False), (256, True)):
            step, network = update_seconds(batch_size, args.seconds, center_frames)
            forward, first = forward_flops(network)
            per_sample = forward + (2 * forward - first) + forward
            row = {
                "precision": policy,
                "batch_size": batch_size,
                "center_frames": center_frames,
                "update_ms": step * 1e3,
                "samples_per_s": batch_size / step,
                "gflop_per_sample": per_sample / 1e9,
                "gflops": batch_size * per_sample / step / 1e9,
                "matmul_peak_gflops": peak / 1e9,
            }
            row["x_peak"] = row["gflops"] / row["matmul_peak_gflops"]
            results.append(row)
            print(
                f"{policy:15s} batch {batch_size:3d}{' centered' if center_frames else '':9s}: "
                f"{row['update_ms']:6.1f} ms/update, "
                f"{row['samples_per_s']:6.0f} samples/s, {row['gflops']:5.1f} GFLOP/s "
                f"({row['x_peak']:.2f} x a {row['matmul_peak_gflops']:.0f} GFLOP/s matmul)",
                flush=True,
            )
    networks.set_precision("float32")
    if args.json:
        write_json(
            args.json,
            {"results": results, "adam_ms": adam, "threads": len(os.sched_getaffinity(0))},
        )


if __name__ == "__main__":
    main()
