#!/usr/bin/env python3
"""Which input layout makes the first convolution cheapest: the frames as they are, or folded
4x4 into channels (space to depth) so the 8x8 stride-4 layer becomes a 2x2 stride-1 one.

    .venv/bin/python benchmarks/first_conv_layout.py \
        --json=benchmarks/results/speed/first_conv_layout__amx.json

Both layouts compute the same outputs: an 8x8 stride-4 kernel over [H, W, 4] frames equals a 2x2
stride-1 kernel over the frames folded into [H/4, W/4, 64] blocks, with the kernel's entries
moved to match (checked here on every row). The fold (like the scaling to [0, 1]) runs in one XLA
function on the uint8 frames, as the networks scale them. For the first layer of the A3C torso
(16 filters) and of the Nature torso (32), at an acting batch (8) and a learning batch (256), in
float32 and mixed bfloat16, it times in CPU milliseconds (this process, every thread) the forward
pass and the forward pass with the kernel's gradient (what training computes: nothing needs the
input's gradient), the median of alternating rounds.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfaccel.bench.results import write_json  # noqa: E402

HEIGHT, WIDTH, STACK, BLOCK = 104, 80, 4, 4


def folded_kernel(kernel: tf.Tensor) -> tf.Tensor:
    """[8, 8, C, F] -> [2, 2, 16 C, F], in the channel order of `fold` (row, column, frame)."""
    size, _, channels, filters = kernel.shape
    taps = size // BLOCK
    blocks = tf.reshape(kernel, [taps, BLOCK, taps, BLOCK, channels, filters])
    blocks = tf.transpose(blocks, [0, 2, 1, 3, 4, 5])  # [i, j, row, column, C, F]
    return tf.reshape(blocks, [taps, taps, BLOCK * BLOCK * channels, filters])


def scaler(dtype, fold: bool):
    """uint8 [B, H, W, C] -> `dtype` in [0, 1], folded to [B, H/4, W/4, 16 C] if `fold`."""

    @tf.function(jit_compile=True)
    def scale(frames):
        x = tf.cast(tf.cast(frames, tf.float32) * (1.0 / 255.0), dtype)
        if not fold:
            return x
        rows, columns = HEIGHT // BLOCK, WIDTH // BLOCK
        x = tf.reshape(x, [-1, rows, BLOCK, columns, BLOCK, STACK])
        x = tf.transpose(x, [0, 1, 3, 2, 4, 5])  # [B, rows, columns, row, column, C]
        return tf.reshape(x, [-1, rows, columns, BLOCK * BLOCK * STACK])

    return scale


def layer(kernel, bias, dtype, fold: bool):
    """The first layer (ReLU) in one layout: (forward, forward with the kernel's gradient)."""
    scale = scaler(dtype, fold)

    def convolve(frames):
        weights = folded_kernel(kernel) if fold else kernel
        stride = 1 if fold else BLOCK
        out = tf.nn.conv2d(scale(frames), tf.cast(weights, dtype), stride, "VALID")
        return tf.nn.relu(out + tf.cast(bias, dtype))

    @tf.function
    def gradient(frames):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(convolve(frames), tf.float32))
        return tape.gradient(loss, [kernel, bias])

    return tf.function(convolve), gradient


def cpu_ms(call, frames, calls: int) -> float:
    call(frames)
    start = time.process_time()
    for _ in range(calls):
        out = call(frames)
    tf.nest.map_structure(lambda t: t.numpy(), out)
    return (time.process_time() - start) / calls * 1e3


def measure(filters: int, batch: int, dtype, rounds: int) -> dict:
    kernel = tf.Variable(tf.random.normal([8, 8, STACK, filters], stddev=0.05))
    bias = tf.Variable(tf.random.normal([filters], stddev=0.05))
    rng = np.random.default_rng(0)
    frames = tf.constant(rng.integers(0, 256, (batch, HEIGHT, WIDTH, STACK), np.uint8))
    layouts = {name: layer(kernel, bias, dtype, name == "folded") for name in ("direct", "folded")}
    direct, folded = (layouts[name][0](frames) for name in ("direct", "folded"))
    error = float(tf.reduce_max(tf.abs(tf.cast(direct, tf.float32) - tf.cast(folded, tf.float32))))
    calls = max(5, 1280 // batch)
    times = {f"{name}_{part}_ms": [] for name in layouts for part in ("forward", "train")}
    for _ in range(rounds):
        for name, (forward, gradient) in layouts.items():
            times[f"{name}_forward_ms"].append(cpu_ms(forward, frames, calls))
            times[f"{name}_train_ms"].append(cpu_ms(gradient, frames, calls))
    row = {"filters": filters, "batch": batch, "dtype": dtype.name, "max_abs_difference": error}
    return row | {name: float(np.median(values)) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(len(os.sched_getaffinity(0)))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = []
    for dtype in (tf.float32, tf.bfloat16):
        for filters in (16, 32):
            for batch in (8, 256):
                row = measure(filters, batch, dtype, args.rounds)
                rows.append(row)
                print(
                    f"{dtype.name:8s} {filters} filters, batch {batch:3d}: forward direct "
                    f"{row['direct_forward_ms']:.2f} / folded {row['folded_forward_ms']:.2f} ms, "
                    f"with kernel gradient {row['direct_train_ms']:.2f} / "
                    f"{row['folded_train_ms']:.2f} ms (max difference {row['max_abs_difference']:.2g})",
                    flush=True,
                )
    if args.json:
        write_json(args.json, {"results": rows, "unit": "CPU ms per call"})


if __name__ == "__main__":
    main()
