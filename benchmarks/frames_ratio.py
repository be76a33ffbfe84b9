#!/usr/bin/env python3
"""How many frames a run needs to reach a reference run's score, as a ratio (the large-batch
target: C51 at batch 256 reaching the batch-32 score in at most 1.25x the frames).

    .venv/bin/python benchmarks/frames_ratio.py --run=c51/b256_pong_bf16 --reference=c51/pong_bf16 \
        --max_ratio=1.25

Both names are summaries written by benchmarks/summarize_run.py (`<algorithm>/<run>`, the file
benchmarks/results/learning/<name>.json, which keeps its curve). The score to reach is the
reference's final score (the mean of its last 20 full games when it ended) unless --score is
given; for each run, the frames are those of the first log row whose score is at least that.
Writes benchmarks/results/learning/<run>__vs_<reference>.json, the reference's `/` written as `_`
(`c51/b256_pong_bf16__vs_c51_pong_bf16.json`).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "learning")


def load(name: str) -> dict:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        sys.exit(f"error: no {path}: summarize the run first (benchmarks/summarize_run.py)")
    with open(path) as handle:
        summary = json.load(handle)
    if "curve" not in summary:
        sys.exit(f"error: {path} has no curve: summarize it again with benchmarks/summarize_run.py")
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="summary name of the run to judge")
    parser.add_argument("--reference", required=True, help="summary name of the reference run")
    parser.add_argument("--score", type=float, default=None, help="default: reference's final")
    parser.add_argument("--max_ratio", type=float, default=1.25)
    args = parser.parse_args()
    run, reference = load(args.run), load(args.reference)
    score = reference["final_score"] if args.score is None else args.score
    reference_frames = results_file.frames_to_reach(reference["curve"], score)
    run_frames = results_file.frames_to_reach(run["curve"], score)
    ratio = run_frames / reference_frames if run_frames and reference_frames else None
    document = {
        "run": args.run,
        "reference": args.reference,
        "score": score,
        "reference_frames": reference_frames,
        "run_frames": run_frames,
        "run_frames_seen": run["env_frames"],
        "ratio": ratio,
        "max_ratio": args.max_ratio,
        "met": ratio is not None and ratio <= args.max_ratio,
    }
    versus = args.reference.replace("/", "_")
    results_file.write_json(os.path.join(RESULTS, f"{args.run}__vs_{versus}.json"), document)
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
