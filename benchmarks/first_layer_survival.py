#!/usr/bin/env python3
"""How many first-layer channels of the A3C network survive the start of an A2C run on Pong,
under variants of the optimizer settings.

    .venv/bin/python benchmarks/first_layer_survival.py --root=runs/survival --name=300k \
        --frames=300000 --seeds=0,1,2,3 --variant="Adam 7e-4=" \
        --variant="1M-frame warm-up=train.warmup_frames = 1_000_000"

Each --variant is `label=binding;binding...` (gin bindings added to `a2c.gin` in bfloat16 with a
constant rate). Trains each variant for --frames frames per seed, then counts with
benchmarks/dead_units.py the ReLU units of each layer still positive on some Pong observation
(a unit positive on none passes nothing upward and gets no gradient again). A run directory under
--root that already holds --frames frames is counted again, not retrained.
Writes benchmarks/results/first_layers/first_layer_survival__<name>.{json,png} (without --name:
first_layer_survival.{json,png}).
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from dead_units import alive_units  # noqa: E402

from tfaccel.bench import results as results_file  # noqa: E402

BASE = [
    "set_precision.policy = 'mixed_bfloat16'",
    "train.decay_learning_rate = False",
    "RunConfig.log_interval_frames = 100_000",
]


def trained_frames(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return 0
    with open(path) as handle:
        lines = handle.read().split()
    return int(lines[-1].split(",")[0]) if len(lines) > 1 else 0


def train(run_dir: str, bindings: list[str], seed: int, frames: int) -> None:
    bindings = [*BASE, *bindings, f"RunConfig.seed = {seed}", f"RunConfig.total_frames = {frames}"]
    bindings.append(f"RunConfig.checkpoint_interval_frames = {frames}")
    command = [sys.executable, "bin/train", "--gin_file=a2c.gin", f"--root_dir={run_dir}"]
    command += [f"--gin_bindings={binding}" for binding in bindings]
    with open(f"{run_dir}.log", "w") as log:
        subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)


def plot(rows: list[dict], labels: list[str], frames: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(max(5, 1.6 * len(labels)), 4))
    for i, label in enumerate(labels):
        alive = [row["conv1_alive"] for row in rows if row["variant"] == label]
        axis.bar(i, sum(alive) / len(alive), color="tab:blue", alpha=0.5)
        axis.plot([i] * len(alive), alive, "o", color="tab:blue")
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylim(0, 16.5)
    axis.set_ylabel("first-layer channels alive (of 16)")
    axis.set_title(f"A2C on Pong after {frames / 1e6:g}M frames: mean and each seed")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory of the run directories")
    parser.add_argument("--name", default=None, help="the results' variant name, e.g. 300k")
    parser.add_argument("--frames", type=int, default=300_000)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--variant", action="append", required=True, help="label=bindings")
    args = parser.parse_args()
    os.makedirs(args.root, exist_ok=True)
    variants = [variant.split("=", 1) for variant in args.variant]
    rows = []
    for label, bindings in variants:
        slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
        for seed in map(int, args.seeds.split(",")):
            run_dir = os.path.join(args.root, f"{slug}_f{args.frames}_s{seed}")
            if trained_frames(run_dir) < args.frames:
                train(
                    run_dir,
                    [b.strip() for b in bindings.split(";") if b.strip()],
                    seed,
                    args.frames,
                )
            layers, spread, _, _ = alive_units(run_dir, steps=100)
            row = {"variant": label, "bindings": bindings, "seed": seed}
            row.update(frames=trained_frames(run_dir), value_std=spread)
            row.update({f"{name}_alive": layer["alive"] for name, layer in layers.items()})
            print(row, flush=True)
            rows.append(row)
    stem = f"first_layer_survival__{args.name}" if args.name else "first_layer_survival"
    out = os.path.join(ROOT, "benchmarks", "results", "first_layers", stem)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    results_file.write_json(f"{out}.json", {"rows": rows})
    plot(rows, [label for label, _ in variants], args.frames, f"{out}.png")
    print(f"wrote {out}.json, {out}.png")


if __name__ == "__main__":
    main()
