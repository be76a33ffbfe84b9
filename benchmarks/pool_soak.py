#!/usr/bin/env python3
"""A 32-env Atari pool stepped for minutes: start time, memory and /dev/shm over time.

    .venv/bin/python benchmarks/pool_soak.py --seconds=300 \
        --json=benchmarks/results/soak/pool_soak.json --plot=benchmarks/results/soak/pool_soak.png

Memory is the resident set (VmRSS) of the caller plus every worker, sampled every few seconds;
"flat" means the last sample is within 5% of the first one taken after the warm-up.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tfaccel.bench.memory import plot_memory, rss_mib, shm_used_mib  # noqa: E402
from tfaccel.bench.results import git_revision  # noqa: E402
from tfaccel.envs.atari import AtariConfig  # noqa: E402
from tfaccel.envs.pool import EnvPool  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--envs_per_worker", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()

    shm_before = shm_used_mib()
    start = time.perf_counter()
    pool = EnvPool(AtariConfig(), args.workers, args.envs_per_worker, num_groups=2)
    pool.reset()
    start_seconds = time.perf_counter() - start
    rng = np.random.default_rng(0)
    table = rng.integers(0, pool.spec.num_actions, (64, pool.group_size)).astype(np.int32)
    samples, steps, games = [], 0, 0
    with pool:
        for group in (0, 1):
            pool.send(table[group], group)
        begin = last = time.perf_counter()
        while (now := time.perf_counter()) - begin < args.seconds:
            for group in (0, 1):
                step = pool.recv(group)
                games += int(step.game_over.sum())
                pool.send(table[rng.integers(64)], group)
                steps += pool.group_size
            if now - last >= args.interval or not samples:
                last = now
                rss = rss_mib(os.getpid()) + sum(rss_mib(pid) for pid in pool.pids)
                samples.append(
                    {"t": now - begin, "steps": steps, "rss_mib": rss, "shm_mib": shm_used_mib()}
                )
        elapsed = time.perf_counter() - begin  # the steps above, not those up to the last sample
        for group in (0, 1):
            pool.recv(group)
    shm_after = shm_used_mib()
    settled = [s for s in samples if s["t"] >= min(30.0, args.seconds / 4)] or samples
    growth = settled[-1]["rss_mib"] / settled[0]["rss_mib"] - 1
    result = {
        "envs": pool.num_envs,
        "workers": args.workers,
        "seconds": args.seconds,
        "start_seconds": start_seconds,
        "agent_steps": steps,
        "sps": steps / elapsed,
        "games_finished": games,
        "rss_growth_after_warmup": growth,
        "shm_mib_before": shm_before,
        "shm_mib_after_close": shm_after,
        "samples": samples,
        "command": " ".join(sys.argv),
        "git_revision": git_revision(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"{pool.num_envs} envs started in {start_seconds:.2f} s; {result['sps']:,.0f} steps/s; "
        f"RSS {settled[0]['rss_mib']:.0f} -> {settled[-1]['rss_mib']:.0f} MiB ({growth:+.1%}); "
        f"/dev/shm {shm_before:.1f} -> {shm_after:.1f} MiB"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    if args.plot:
        plot_memory(
            args.plot,
            samples,
            {"RSS, caller + workers": "rss_mib", "/dev/shm used": "shm_mib"},
            f"{pool.num_envs}-env Pong pool, {args.workers} workers",
            in_minutes=False,
        )


if __name__ == "__main__":
    main()
