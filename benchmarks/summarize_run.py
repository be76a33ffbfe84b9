#!/usr/bin/env python3
"""A training run's learning curve and figures, from its metrics.csv, as JSON and PNG.

    .venv/bin/python benchmarks/summarize_run.py --run_dir=runs/a2c_pong --name=a2c/pong \
        --target=18 --train_command="benchmarks/pong.sh a2c.gin"

`--name` is `<algorithm>/<run>` (a2c, a3c, ppo, dqn, c51, rainbow; benchmarks/README.md). Writes
benchmarks/results/learning/<name>.json (the final and best score as the mean of the last 20 full
games, frames and wall time to reach the target, steps/s and its env/inference/learning split,
and the curve itself, so runs can be compared after their run directories are gone:
benchmarks/frames_ratio.py) and benchmarks/results/learning/<name>.png (raw score against frames and
against wall time).
"""

import argparse
import csv
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel import plot  # noqa: E402
from tfaccel.bench import results as results_file  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "learning")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--name", required=True, help="<algorithm>/<run>, e.g. a2c/pong")
    parser.add_argument("--target", type=float, default=18.0)
    parser.add_argument(
        "--train_command", default=None, help="the command that made the run, kept in the JSON"
    )
    args = parser.parse_args()
    path = os.path.join(args.run_dir, "metrics.csv")
    if not os.path.exists(path):
        sys.exit(f"error: no metrics.csv in {args.run_dir}")
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle)]
    frames = [int(row["env_frames"]) for row in rows]
    wall = [float(row["wall_s"]) for row in rows]
    score = [float(row["episode_return_raw_mean"]) for row in rows]
    reached = results_file.first_at_least(score, args.target)
    last = rows[-1]
    summary = {
        "name": args.name,
        "run_dir": args.run_dir,
        "env_frames": frames[-1],
        "wall_s": wall[-1],
        "final_score": score[-1],
        "best_score": max((s for s in score if not math.isnan(s)), default=float("nan")),
        "target": args.target,
        "frames_to_target": None if reached is None else frames[reached],
        "wall_s_to_target": None if reached is None else wall[reached],
        "agent_steps_per_s": frames[-1] / 4 / wall[-1] if wall[-1] else 0.0,
        "time_split_last_interval": {
            part: float(last[f"{part}_fraction"]) for part in ("env", "inference", "learn")
        },
        "curve": {
            "env_frames": frames,
            "wall_s": wall,
            "score": [None if math.isnan(s) else s for s in score],  # no finished game yet: None
        },
    }
    if args.train_command:
        summary["train_command"] = args.train_command
    out = os.path.join(RESULTS, args.name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    results_file.write_json(f"{out}.json", summary)
    # The curve is bin/plot's (tfaccel.plot), as for every curve in benchmarks/.
    plot.plot([args.run_dir], f"{out}.png", args.name, args.target)
    print(json.dumps({k: v for k, v in summary.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
