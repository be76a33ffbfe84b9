#!/usr/bin/env bash
# PPO (ppo.gin: the paper's Atari settings) on Pong for 20M frames; resumable: run it again with
# the same directory to continue. Then:
#   .venv/bin/python benchmarks/summarize_run.py --run_dir=$RUN --name=ppo_pong
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-/work/runs/ppo_pong}
exec .venv/bin/python bin/train --gin_file=ppo.gin --root_dir="$RUN" "$@"
