#!/usr/bin/env bash
# A learning run on Pong with one of tfaccel's gin configs, to its config's total_frames;
# resumable: run the same command again to continue from the last checkpoint.
#   benchmarks/pong.sh ppo.gin                      # run directory runs/ppo_pong
#   benchmarks/pong.sh categorical_dqn.gin --gin_bindings='train_off_policy.checkpoint_replay = True'
#   RUN=/tmp/my_run benchmarks/pong.sh a2c.gin
# The script runs from the checkout root, so RUN (default runs/<config>_pong) and any other
# relative path are taken from there.
# Then: .venv/bin/python benchmarks/summarize_run.py --run_dir=$RUN --name=<algorithm>/<run> --target=18
# (writes benchmarks/results/learning/<algorithm>/<run>.{json,png}; e.g. --name=ppo/pong)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: benchmarks/pong.sh <config.gin> [bin/train flags]}
shift
RUN=${RUN:-runs/${CONFIG%.gin}_pong}
exec .venv/bin/python bin/train --gin_file="$CONFIG" --root_dir="$RUN" "$@"
