#!/usr/bin/env bash
# A2C (PAAC settings, 64 envs in two alternating groups) on Pong for 40M frames; resumable:
# run it again with the same directory to continue. Then:
#   .venv/bin/python benchmarks/summarize_run.py --run_dir=$RUN --name=a2c_pong
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-/work/runs/a2c_pong}
exec .venv/bin/python bin/train --gin_file=a2c.gin --root_dir="$RUN" "$@"
