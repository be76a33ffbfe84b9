"""End-to-end training throughput: tfaccel-train for a while, agent steps/s read from metrics.csv.

The third level of measurement, after the pool alone and the pool with inference
(docs/results.md, "Throughput"): simulation, inference and learning share the cores. The run
starts in a fresh process (its own TensorFlow, as a user runs it); the first `warmup` seconds
(process start, tracing) are left out of the figure.
"""

from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
import tempfile

# The directory that holds the tfaccel package: a checkout, or site-packages.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def select(variants: dict, only: str) -> dict:
    """The variants whose name contains `only` (a benchmark's `--only`); exits naming the
    variants when none does."""
    chosen = {name: variant for name, variant in variants.items() if only in name}
    if not chosen:
        sys.exit(f"error: no variant contains {only!r}; the variants: {'; '.join(variants)}")
    return chosen


def training_sps(
    game: str,
    workers: int,
    envs_per_worker: int,
    seconds: float,
    config: str = "a2c.gin",
    num_groups: int = 2,
    warmup: float = 15.0,
    extra_bindings: tuple[str, ...] = (),
    trainer: str = "train",
    extra_columns: tuple[str, ...] = (),
) -> dict:
    """Trains `config` for `warmup + seconds` and returns agent steps/s and the time split.

    `trainer` is the gin name of the config's trainer (`train`, or `train_off_policy` for the
    Q-value configs); `extra_columns` of the last metrics.csv row are returned too.

    Raises:
        RuntimeError: the training command failed (its last output lines are in the message).
    """
    with tempfile.TemporaryDirectory() as root_dir:
        bindings = [
            f"AtariConfig.game = '{game}'",
            f"PoolConfig.num_workers = {workers}",
            f"PoolConfig.envs_per_worker = {envs_per_worker}",
            f"PoolConfig.num_groups = {num_groups}",
            "RunConfig.total_frames = 10_000_000_000",
            f"RunConfig.max_wall_seconds = {warmup + seconds}",
            # a row per 8 steps of every env (at least 100 agent steps): enough rows to measure
            # even a short run on a loaded machine, few enough to cost nothing
            f"RunConfig.log_interval_frames = {max(400, 32 * workers * envs_per_worker)}",
            "RunConfig.checkpoint_interval_frames = 10_000_000_000",
            *extra_bindings,
        ]
        # The package's own command, not bin/train: an install from a wheel has no bin/. The
        # directory that holds this tfaccel goes first on the path, so it is the one imported.
        command = [sys.executable, "-m", "tfaccel.commands.train", f"--gin_file={config}"]
        command += [f"--root_dir={root_dir}"] + [f"--gin_bindings={b}" for b in bindings]
        path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
        with open(os.path.join(root_dir, "metrics.csv"), newline="") as handle:
            rows = list(csv.DictReader(handle))
    if len(rows) < 2:
        raise RuntimeError(
            f"the run logged {len(rows)} rows in {warmup + seconds:.0f} s, too few to measure: "
            "give it more seconds"
        )
    settled = [row for row in rows if float(row["wall_s"]) >= warmup]
    first, last = (settled if len(settled) >= 2 else rows)[0], rows[-1]
    elapsed = float(last["wall_s"]) - float(first["wall_s"])
    steps = int(last["agent_steps"]) - int(first["agent_steps"])
    return {
        "sps": steps / elapsed if elapsed > 0 else 0.0,
        "env_fraction": float(last["env_fraction"]),
        "inference_fraction": float(last["inference_fraction"]),
        "learn_fraction": float(last["learn_fraction"]),
        "config": config,
        **{column: float(last[column]) for column in extra_columns},
    }


def against_limit(variants: dict, json_path: str | None = None, rounds: int = 1) -> list[dict]:
    """Runs `variants` (name -> a call returning a `training_sps` row) between measures of the
    limit (one process stepping one Pong env with random actions, times the cores), prints each
    row and its ratio to the limit, writes them to `json_path`, returns them.

    With `rounds` > 1 every variant runs once per round, the limit is measured between rounds,
    and each run's ratio takes the median of the limits around its round: the rows report the
    median ratio and steps/s over the rounds and their range, so that the VM's drift from minute
    to minute (10-15% here) shows instead of deciding a single figure.
    """
    from tfaccel.bench.peers import raw_single_process_sps
    from tfaccel.bench.results import write_json
    from tfaccel.envs.atari import AtariConfig

    cpus = len(os.sched_getaffinity(0))
    raws = [raw_single_process_sps(AtariConfig(), 10.0)]
    width = max(map(len, variants))
    runs = {name: [] for name in variants}
    for round_ in range(rounds):
        for name, measure in variants.items():
            row = dict(measure(), variant=name, round=round_)
            runs[name].append(row)
            print(
                f"{name:{width}s} {row['sps']:7.0f} steps/s  env {row['env_fraction']:.0%} "
                f"inference {row['inference_fraction']:.0%} learning {row['learn_fraction']:.0%}",
                flush=True,
            )
        raws.append(raw_single_process_sps(AtariConfig(), 10.0))
    limit = statistics.median(raws) * cpus
    print(f"limit: {limit:,.0f} steps/s ({cpus} cores; single process {raws})")
    results = []
    for name, rows in runs.items():
        for row in rows:
            row["x_limit"] = row["sps"] / (
                statistics.median(raws[row["round"] : row["round"] + 2]) * cpus
            )
        ratios = [row["x_limit"] for row in rows]
        result = dict(
            sorted(rows, key=lambda row: row["x_limit"])[(len(rows) - 1) // 2],  # its time split
            x_limit=statistics.median(ratios),
            sps=statistics.median(row["sps"] for row in rows),
            x_limit_range=[min(ratios), max(ratios)],
            sps_runs=[row["sps"] for row in rows],
        )
        results.append(result)
        print(
            f"{name:{width}s} {result['x_limit']:.3f} x limit  "
            f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
        )
    if json_path:
        write_json(
            json_path,
            {"limit_sps": limit, "raw_single_process": raws, "rounds": rounds, "results": results},
        )
    return results
