#!/usr/bin/env python3
"""Memory and time to restore a checkpointed replay (`checkpoint_replay = True`).

    .venv/bin/python benchmarks/replay_restore.py --json=benchmarks/results/speed/replay_restore.json

Fills the two groups' buffers of a Q-value run (16 envs each, 104x80 frames, 3-step,
prioritized; `--capacity` transitions in all) with random frames, saves them as the trainer does
(`replay_files.save`), then restores the file in a fresh process per way of reading it:

- `blocks`: as the trainer reads it (`replay_files.restore`): each group's frames copied
  from the file block by block into the buffer;
- `whole`: each group's arrays read whole from the file, then copied in (how it read before).

For each it reports the restore's wall time and its transient memory: the process's peak
resident memory (VmHWM) less its resident memory once restored (the filled buffers). The whole
read's transient is one group's frames (4.2 GB at 1M transitions); the blocks' is one block.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402

FRAME = (104, 80)
ENVS = 16  # per group
GROUPS = 2


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _buffers(capacity: int, seed: int = 0):
    from tfaccel.replay import ReplayBuffer

    return [
        ReplayBuffer(ENVS, capacity // GROUPS, FRAME, n_step=3, prioritized=True, seed=seed + g)
        for g in range(GROUPS)
    ]


def fill_and_save(capacity: int, directory: str) -> None:
    from tfaccel import replay_files

    rng = np.random.default_rng(0)
    observations = rng.integers(0, 256, (8, ENVS, *FRAME, 4), dtype=np.uint8)
    zeros = np.zeros(ENVS, np.float32)
    buffers = _buffers(capacity)
    for buffer in buffers:
        for t in range(buffer.time):
            buffer.add(
                observations[t % 8], rng.integers(0, 6, ENVS), zeros, np.zeros(ENVS, bool),
                np.zeros(ENVS, bool), observations[t % 8],
            )  # fmt: skip
    assert replay_files.save(directory, capacity, buffers, log=None)


def restore(capacity: int, directory: str, how: str) -> dict:
    from tfaccel import replay_files

    buffers = _buffers(capacity, seed=7)
    path = replay_files.path(directory, capacity)
    start = time.perf_counter()
    if how == "blocks":
        assert replay_files.restore(directory, f"{directory}/ckpt-{capacity}", buffers)
    else:
        with np.load(path, allow_pickle=False) as archive:
            for g, buffer in enumerate(buffers):
                prefix = f"group{g}/"
                buffer.load_state_dict(
                    {k[len(prefix) :]: archive[k] for k in archive.files if k.startswith(prefix)}
                )
    seconds = time.perf_counter() - start
    peak, resident = _status_bytes("VmHWM"), _status_bytes("VmRSS")
    frames = sum(buffer._frames.nbytes for buffer in buffers)
    return {
        "how": how,
        "capacity": capacity,
        "file_bytes": os.path.getsize(path),
        "frames_bytes": frames,
        "restore_s": seconds,
        "transient_bytes": peak - resident,
        "transient_over_frames": (peak - resident) / frames,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=400_000)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "fill":
        fill_and_save(args.capacity, args.directory)
        return
    if args.child:
        print(json.dumps(restore(args.capacity, args.directory, args.child)))
        return
    results = []
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "benchmarks")) as directory:
        child = [
            sys.executable,
            __file__,
            f"--capacity={args.capacity}",
            f"--directory={directory}",
        ]
        subprocess.run([*child, "--child=fill"], check=True)
        for how in ("blocks", "whole"):
            out = subprocess.run([*child, f"--child={how}"], capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(row)
            print(
                f"{how:>6}: {row['file_bytes'] / 2**30:.2f} GiB file restored in "
                f"{row['restore_s']:.1f} s, transient memory {row['transient_bytes'] / 2**20:,.0f} "
                f"MiB ({row['transient_over_frames']:.2f} x the frames)",
                flush=True,
            )
    if args.json:
        results_file.write_json(args.json, {"results": results})


if __name__ == "__main__":
    main()
