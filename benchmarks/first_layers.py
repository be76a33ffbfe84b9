#!/usr/bin/env python3
"""Short runs of one config on several games under variants of its first layers (input
centering, initialization, ...): does the network keep telling frames apart, and does it learn?

    .venv/bin/python benchmarks/first_layers.py --root=runs/first_layers --name=a2c \
        --config=a2c.gin --games=breakout,pong --frames=4000000 \
        --base="set_precision.policy = 'mixed_bfloat16';train.decay_learning_rate = False" \
        --variant="glorot=" \
        --variant="ortho=a3c_torso.orthogonal_init = True;PolicyValueNetwork.orthogonal_init = True"

Each --variant is `label=binding;binding...`, added after --base to --config. Trains each
variant on each game for --frames frames in `<root>/<label>_<game>` (a run directory that
already holds them is read, not retrained; with --train an unfinished one resumes, without it
it is read as far as it went), then reads its
metrics.csv (the score, the spread of the network's output over a batch, explained variance,
entropy) and counts with benchmarks/dead_units.py the ReLU units still positive on some frame of
random play. Writes benchmarks/results/first_layers/first_layers__<name>.{json,png} (without
--name: first_layers.{json,png}): a panel per game with a curve per variant, and a row per run.
"""

import argparse
import csv
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from dead_units import alive_units  # noqa: E402
from suite_summary import trained_frames  # noqa: E402

from tfaccel.bench import results as results_file  # noqa: E402

COLUMNS = ("episode_return_raw_mean", "value_std", "q_std", "explained_variance", "entropy")


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def train(run_dir: str, config: str, bindings: list[str], game: str, frames: int) -> None:
    bindings = [f"AtariConfig.game = '{game}'", *bindings, f"RunConfig.total_frames = {frames}"]
    command = [sys.executable, "bin/train", f"--gin_file={config}", f"--root_dir={run_dir}"]
    command += [f"--gin_bindings={binding}" for binding in bindings]
    with open(f"{run_dir}.log", "a") as log:
        subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)


def curve(run_dir: str) -> dict:
    """The metrics rows of a run, column by column (None where a row has no value)."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))

    def number(text):
        return None if text in (None, "", "nan") else float(text)

    result = {"env_frames": [int(row["env_frames"]) for row in rows]}
    for column in COLUMNS:
        if column in rows[0]:
            result[column] = [number(row.get(column)) for row in rows]
    return result


def plot(rows: list[dict], games: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(games), figsize=(5.5 * len(games), 7), squeeze=False)
    for column, game in enumerate(games):
        for row in [r for r in rows if r["game"] == game]:
            frames = [f / 1e6 for f in row["curve"]["env_frames"]]
            axes[0, column].plot(
                frames, row["curve"]["episode_return_raw_mean"], label=row["variant"]
            )
            spread = row["curve"].get("value_std") or row["curve"].get("q_std")
            axes[1, column].plot(frames, spread, label=row["variant"])
        axes[0, column].set_title(f"{game}: raw score (last 20 games)")
        axes[1, column].set_title(f"{game}: output spread over a batch")
        axes[1, column].set_yscale("log")
        for axis in axes[:, column]:
            axis.set_xlabel("env frames (M)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory of the run directories")
    parser.add_argument("--name", default=None, help="the results' variant name, e.g. a2c")
    parser.add_argument("--config", default="a2c.gin")
    parser.add_argument("--games", default="breakout,pong")
    parser.add_argument("--frames", type=int, default=4_000_000)
    parser.add_argument("--base", default="", help="bindings of every variant, ';'-separated")
    parser.add_argument("--variant", action="append", required=True, help="label=bindings")
    parser.add_argument("--train", action="store_true", help="train what is missing (else read)")
    args = parser.parse_args()
    base = [b.strip() for b in args.base.split(";") if b.strip()]
    games = args.games.split(",")
    rows = []
    for label, bindings in (variant.split("=", 1) for variant in args.variant):
        for game in games:
            run_dir = os.path.join(args.root, f"{slug(label)}_{game}")
            if trained_frames(run_dir) < args.frames:
                if not args.train and not trained_frames(run_dir):
                    print(f"skipped {run_dir}: not trained", flush=True)
                    continue
                if args.train:  # else read as far as it went (a run stopped early)
                    extra = [b.strip() for b in bindings.split(";") if b.strip()]
                    train(run_dir, args.config, base + extra, game, args.frames)
            layers, spread, _, _ = alive_units(run_dir, steps=100)
            row = {"variant": label, "bindings": bindings, "game": game, "run_dir": run_dir}
            row.update(frames=trained_frames(run_dir), output_spread=spread, curve=curve(run_dir))
            row.update({f"{name}_alive": layer["alive"] for name, layer in layers.items()})
            print({k: v for k, v in row.items() if k != "curve"}, flush=True)
            rows.append(row)
    stem = f"first_layers__{args.name}" if args.name else "first_layers"
    out = os.path.join(ROOT, "benchmarks", "results", "first_layers", stem)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    results_file.write_json(f"{out}.json", {"config": args.config, "base": base, "rows": rows})
    plot(rows, games, f"{out}.png")
    print(f"wrote {out}.json, {out}.png")


if __name__ == "__main__":
    main()
