#!/usr/bin/env python3
"""Parameter store overhead: one pull plus one push of the paper's policy-gradient
network (the A3C torso on 104x80x4 Pong frames, 6 actions), median over repeats.

    .venv/bin/python benchmarks/param_store.py --json=benchmarks/results/speed/param_store.json

Also with a second process pushing into the same store at the same time (contention on the
chunk locks). Target: a pull plus a push <= 1 ms.
"""

import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402
from tfaccel.distribute.param_store import ParameterStore  # noqa: E402


def a3c_parameters() -> int:
    """conv 16 8x8/4, conv 32 4x4/2, FC 256, policy (6) and value heads, on 104x80x4."""
    conv1 = 8 * 8 * 4 * 16 + 16
    conv2 = 4 * 4 * 16 * 32 + 32
    features = 11 * 8 * 32  # the second conv's 11 x 8 output
    return conv1 + conv2 + features * 256 + 256 + 256 * 7 + 7


def round_trip_ms(store: ParameterStore, repeats: int) -> float:
    out = np.empty(store.size, np.float32)
    delta = np.full(store.size, 1e-6, np.float32)
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        store.pull(out)
        store.push(delta)
        times.append(time.perf_counter() - tick)
    return float(np.median(times) * 1e3)


def _pusher(handle, stop):
    store = ParameterStore.attach(handle)
    delta = np.full(store.size, 1e-6, np.float32)
    while not stop.is_set():
        store.push(delta)
    store.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    size = a3c_parameters()
    context = multiprocessing.get_context("spawn")
    rows = []
    for chunks in (1, 16, 64):
        store = ParameterStore.create(size, chunks=chunks)
        alone = round_trip_ms(store, args.repeats)
        stop = context.Event()
        other = context.Process(target=_pusher, args=(store.handle(), stop))
        other.start()
        time.sleep(1.0)
        contended = round_trip_ms(store, args.repeats)
        stop.set()
        other.join()
        store.close()
        rows.append({"chunks": chunks, "alone_ms": alone, "with_a_second_pusher_ms": contended})
        print(
            f"{size:,} parameters, {chunks:>2} chunks: pull + push {alone:.3f} ms alone, "
            f"{contended:.3f} ms while another process pushes",
            flush=True,
        )
    if args.json:
        results_file.write_json(args.json, {"parameters": size, "results": rows})


if __name__ == "__main__":
    main()
