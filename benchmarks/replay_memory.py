#!/usr/bin/env python3
"""Replay memory and batch assembly: bytes per stored frame, and the time to sample.

    .venv/bin/python benchmarks/replay_memory.py --json=benchmarks/results/speed/replay_memory.json \
        --plot=benchmarks/results/speed/replay_memory.png

For each capacity a fresh process fills a `ReplayBuffer` of 104x80 frames (32 envs, 3-step,
prioritized) with random frames and measures how much its resident memory grew; the target is
within 10% of one byte per pixel per stored frame, growing linearly with the capacity (so 1M
transitions need about 8.3 GB). Then it times `sample(N)` (stacked observations and bootstrap
observations, weights, indices) for N = 32, 256 and 512, median of 50 draws, and the 512
stacked observations alone (target: under 5 ms), assembled by 1, 2 and 4 threads.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402

FRAME = (104, 80)
ENVS = 32


def _rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(capacity: int) -> dict:
    """Runs in a child process: fills a buffer of `capacity` transitions and samples from it."""
    from tfaccel.replay import ReplayBuffer

    rng = np.random.default_rng(0)
    observations = rng.integers(0, 256, (8, ENVS, *FRAME, 4), dtype=np.uint8)
    zeros = np.zeros(ENVS, np.float32)
    before = _rss_bytes()
    replay = ReplayBuffer(ENVS, capacity, FRAME, n_step=3, prioritized=True, seed=0)
    steps = capacity // ENVS
    start = time.perf_counter()
    for t in range(steps):
        done = np.zeros(ENVS, bool)
        done[t % ENVS] = t % 100 == 99  # episodes end now and then
        replay.add(
            observations[t % 8], rng.integers(0, 6, ENVS), zeros, done, zeros.astype(bool),
            observations[t % 8],
        )  # fmt: skip
    add_us = (time.perf_counter() - start) / steps * 1e6
    grown = _rss_bytes() - before
    frames = steps * ENVS
    result = {
        "capacity": capacity,
        "stored_frames": frames,
        "rss_growth_bytes": grown,
        "bytes_per_frame_pixel": grown / (frames * FRAME[0] * FRAME[1]),
        "add_us_per_step_of_32_envs": add_us,
    }
    for size in (32, 256, 512):
        replay.sample(size)  # warm the caches
        times = []
        for _ in range(50):
            tick = time.perf_counter()
            batch = replay.sample(size)
            times.append(time.perf_counter() - tick)
            replay.update_priorities(batch.index, rng.uniform(0, 2, size))
        result[f"sample_{size}_ms"] = float(np.median(times) * 1e3)
    # The stacked observations alone (the target's "batch of 512 stacked observations"): one
    # of the two stack rebuilds inside sample(), without the bootstrap observations; by the
    # calling thread alone (the buffer's default) and split among 2 and 4 threads.
    slot, env = np.divmod(replay.sample(512).index, ENVS)
    step, start = replay._steps(slot), replay._start[slot, env]
    by_threads = {}
    for threads in (1, 2, 4):
        replay.assembly_threads = threads
        replay._observations(step, env, start)  # starts the threads
        times = []
        for _ in range(50):
            tick = time.perf_counter()
            replay._observations(step, env, start)
            times.append(time.perf_counter() - tick)
        by_threads[str(threads)] = float(np.median(times) * 1e3)
    result["stacks_512_ms"] = by_threads["1"]
    result["stacks_512_ms_by_threads"] = by_threads
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", default="50000,100000,200000,400000")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    results = []
    for capacity in (int(c) for c in args.capacities.split(",")):
        out = subprocess.run(
            [sys.executable, __file__, f"--child={capacity}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(row)
        print(
            f"capacity {capacity:>9,}  RSS +{row['rss_growth_bytes'] / 2**20:8.1f} MiB  "
            f"{row['bytes_per_frame_pixel']:.3f} B/pixel  add {row['add_us_per_step_of_32_envs']:.0f} us  "
            f"sample 32/256/512: {row['sample_32_ms']:.2f} / {row['sample_256_ms']:.2f} / "
            f"{row['sample_512_ms']:.2f} ms, 512 stacks alone (1/2/4 threads) "
            + " / ".join(f"{ms:.2f}" for ms in row["stacks_512_ms_by_threads"].values())
            + " ms",
            flush=True,
        )
    capacities = np.array([r["capacity"] for r in results], float)
    grown = np.array([r["rss_growth_bytes"] for r in results], float)
    slope, intercept = np.polyfit(capacities, grown, 1)
    summary = {
        "bytes_per_transition_slope": slope,
        "slope_per_frame_pixel": slope / (FRAME[0] * FRAME[1]),
        "intercept_bytes": intercept,
        "projected_1m_gb": (slope * 1e6 + intercept) / 1e9,
    }
    print(
        f"linear fit: {summary['slope_per_frame_pixel']:.3f} B per pixel per transition, "
        f"1M transitions -> {summary['projected_1m_gb']:.2f} GB"
    )
    if args.json:
        results_file.write_json(
            args.json,
            {
                "frame_shape": FRAME,
                "envs": ENVS,
                "results": results,
                "fit": summary,
            },
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        left.plot(capacities / 1e3, grown / 2**20, "o-", label="measured RSS growth")
        one_byte = capacities * FRAME[0] * FRAME[1] / 2**20
        left.plot(capacities / 1e3, one_byte, "--", label="1 byte per pixel per frame")
        left.set_xlabel("capacity (thousand transitions)")
        left.set_ylabel("MiB")
        left.legend()
        sizes = [32, 256, 512]
        right.plot(sizes, [results[-1][f"sample_{s}_ms"] for s in sizes], "o-", label="sample()")
        for threads, ms in results[-1]["stacks_512_ms_by_threads"].items():
            right.plot([512], [ms], "s", label=f"512 stacks alone, {threads} thread(s)")
        right.axhline(5.0, color="gray", linestyle="--", label="target for 512 stacks: 5 ms")
        right.set_xlabel("batch size")
        right.set_ylabel(f"ms per sample() at capacity {int(capacities[-1]):,}")
        right.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
