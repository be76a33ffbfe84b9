#!/usr/bin/env python3
"""A Q-value run's Pong curve against Dopamine's published runs of the same agent.

    .venv/bin/python benchmarks/against_dopamine.py --run=c51/pong_bf16 --agent=C51

`--run` names summaries written by benchmarks/summarize_run.py (`<algorithm>/<run>`, the file
benchmarks/results/learning/<name>.json; repeatable); `--agent` is one of Dopamine's agents in
benchmarks/reference/dopamine_pong.json (DQN, C51, Rainbow: five runs each, with the settings our
gin files take from Dopamine's). Writes
benchmarks/results/learning/<first run>__vs_dopamine.{json,png}: for each run and for Dopamine's
five, the score after 5, 10, 20 and 30M frames and the frames to +15 and +18.

Dopamine plays with sticky actions (0.25) and we do not (the papers' setting): its runs are the
reference for the shape and pace of a curve with these hyperparameters, not an exact match.
Dopamine's score of an iteration is the mean of the games played during its 1M frames, placed
here at the iteration's middle frame; ours is the mean of the last 20 games at a log row. A run's
score "after F frames" is its last row at or before F (None if it has none, or stopped before F).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "learning")
REFERENCE = os.path.join(ROOT, "benchmarks", "reference", "dopamine_pong.json")
CHECKPOINTS = (5_000_000, 10_000_000, 20_000_000, 30_000_000)  # env frames
THRESHOLDS = (15.0, 18.0)
TARGETS = {"DQN": 15.0, "C51": 18.0, "Rainbow": 18.0}  # target score within 10M frames


def figures(frames: list, score: list) -> dict:
    """The score after each of CHECKPOINTS and the frames to each of THRESHOLDS of one curve."""
    document = {
        f"score_at_{at // 1_000_000}M": results_file.value_at(frames, score, at)
        for at in CHECKPOINTS
    }
    curve = {"env_frames": frames, "score": score}
    for threshold in THRESHOLDS:
        document[f"frames_to_{threshold:+.0f}"] = results_file.frames_to_reach(curve, threshold)
    return document


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", action="append", required=True, help="<algorithm>/<run> (repeatable)"
    )
    parser.add_argument("--agent", required=True, help="Dopamine agent: DQN, C51 or Rainbow")
    args = parser.parse_args()
    with open(REFERENCE) as handle:
        reference = json.load(handle)
    if args.agent not in reference["runs"]:
        sys.exit(f"error: unknown agent {args.agent!r}; valid: {', '.join(reference['runs'])}")
    step = reference["frames_per_iteration"]
    dopamine = reference["runs"][args.agent]
    dopamine_frames = [(i + 0.5) * step for i in range(len(dopamine[0]))]  # iterations' middles
    ours = {}
    for name in args.run:
        path = os.path.join(RESULTS, f"{name}.json")
        if not os.path.exists(path):
            sys.exit(f"error: no {path}: summarize the run first (benchmarks/summarize_run.py)")
        with open(path) as handle:
            ours[name] = json.load(handle)["curve"]
    document = {
        "agent": args.agent,
        "reference": reference["source"],
        "reference_settings": reference["settings"][args.agent],
        "runs": {name: figures(c["env_frames"], c["score"]) for name, c in ours.items()},
        "dopamine_runs": [figures(dopamine_frames, run) for run in dopamine],
    }
    out = os.path.join(RESULTS, f"{args.run[0]}__vs_dopamine")
    results_file.write_json(out + ".json", document)
    _plot(out + ".png", args.agent, ours, dopamine_frames, dopamine)
    print(json.dumps({k: document[k] for k in ("runs", "dopamine_runs")}, indent=1))


def _plot(out: str, agent: str, ours: dict, dopamine_frames: list, dopamine: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, axes = plt.subplots(figsize=(7, 4.5))
    x = np.asarray(dopamine_frames) / 1e6
    runs = np.asarray(dopamine, dtype=float)  # [5, iterations]
    axes.fill_between(x, runs.min(0), runs.max(0), color="gray", alpha=0.25)
    axes.plot(x, np.median(runs, 0), color="gray", label=f"Dopamine {agent}: median, range of 5")
    for name, curve in ours.items():
        points = [
            (f, s)
            for f, s in zip(curve["env_frames"], curve["score"], strict=True)
            if s is not None
        ]
        axes.plot([f / 1e6 for f, _ in points], [s for _, s in points], label=name)
    target = TARGETS[agent]
    axes.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:+.0f}")
    axes.set_xlim(0, max(max(c["env_frames"]) for c in ours.values()) / 1e6 * 1.5)
    axes.set_xlabel("env frames (millions)")
    axes.set_ylabel("raw score")
    axes.set_title(f"Pong: tfaccel against Dopamine's published {agent} runs (sticky actions)")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
