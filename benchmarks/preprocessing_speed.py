#!/usr/bin/env python3
"""How long the networks take to turn a batch of uint8 frames into their first layer's input.

    .venv/bin/python benchmarks/preprocessing_speed.py --json=benchmarks/results/speed/preprocessing_speed.json

For 512 Pong observations (104x80x4, the online and target inputs of a batch-256 update) in
float32 and bfloat16: scaling to [0, 1] and centering each frame (`CenterFrames`), written with
TensorFlow's ops one after the other against what `networks` does (the same ops in float32; in
bfloat16, XLA-compiled passes computing in float32). Each is timed inside a
`tf.function` followed by the Nature network's first convolution, as the learner calls it (a
preprocessing timed alone would be timed copying its output out); the convolution alone on
frames already scaled is timed too, and subtracted: `*_ms` is the preprocessing's share.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfaccel import networks  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402


def ops_scaled(frames, dtype):
    return tf.cast(frames, dtype) * (1.0 / 255.0)


def ops_centered(frames, dtype):
    x = ops_scaled(frames, dtype)
    return x - tf.cast(tf.reduce_mean(tf.cast(x, tf.float32), [1, 2], keepdims=True), dtype)


def now_scaled(frames, dtype):
    return networks._scaled(frames, dtype)


def now_centered(frames, dtype):
    return networks.CenterFrames(dtype=dtype)(networks._scaled(frames, dtype))


def milliseconds(function, frames, seconds: float) -> float:
    """Milliseconds per call of the compiled `function(frames)`, after 3 untimed calls."""
    for _ in range(3):
        function(frames).numpy()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        function(frames).numpy()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3


def with_first_layer(preprocess, dtype):
    """`preprocess` then the Nature network's first convolution, as one compiled call."""
    conv = networks.nature_torso()[0]
    conv.build((None, 104, 80, 4))

    @tf.function
    def call(frames):
        x = preprocess(frames, dtype)
        return tf.reduce_sum(tf.cast(conv(tf.cast(x, conv.compute_dtype)), tf.float32))

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    frames = tf.constant(
        np.random.default_rng(0).integers(0, 256, (args.batch, 104, 80, 4), np.uint8)
    )
    results = []
    for dtype in ("float32", "bfloat16"):
        keras_policy = "float32" if dtype == "float32" else "mixed_bfloat16"
        networks.set_precision(keras_policy)
        scaled = tf.cast(tf.cast(frames, tf.float32) / 255.0, dtype)
        floor = milliseconds(with_first_layer(lambda x, d: x, dtype), scaled, args.seconds)
        for step, before, now in (
            ("scale", ops_scaled, now_scaled),
            ("scale and center", ops_centered, now_centered),
        ):
            old_fn = tf.function(lambda x, f=before, d=dtype: f(x, d))
            new_fn = tf.function(lambda x, f=now, d=dtype: f(x, d))
            gap = np.abs(
                new_fn(frames).numpy().astype(np.float32)
                - old_fn(frames).numpy().astype(np.float32)
            ).max()
            row = {
                "dtype": dtype,
                "step": step,
                "batch": args.batch,
                "first_layer_alone_ms": floor,
                "tf_ops_ms": milliseconds(with_first_layer(before, dtype), frames, args.seconds)
                - floor,
                "tfaccel_ms": milliseconds(with_first_layer(now, dtype), frames, args.seconds)
                - floor,
                "max_abs_difference": float(gap),
            }
            row["speedup"] = row["tf_ops_ms"] / row["tfaccel_ms"]
            results.append(row)
            print(
                f"{dtype:8s} {step:16s}: TensorFlow ops {row['tf_ops_ms']:6.1f} ms, tfaccel "
                f"{row['tfaccel_ms']:6.1f} ms ({row['speedup']:.1f}x; the first layer alone "
                f"{floor:.1f} ms), largest difference {gap:.4f}",
                flush=True,
            )
    networks.set_precision("float32")
    if args.json:
        write_json(args.json, {"results": results, "threads": len(os.sched_getaffinity(0))})


if __name__ == "__main__":
    main()
