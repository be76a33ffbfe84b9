"""Sampler throughput: the limit of the machine, tfaccel's pool, and the peers, in one run.

What is counted (docs/results.md, "Sampler"): agent steps per second summed over all envs, after
a warm-up that excludes process start and tracing, with the preprocessing used in training.

- The limit: one process stepping one env with random actions, times the number of cores.
- The pool with random actions (`inference="none"`, alternating groups keep workers busy), with
  one batched policy call per step (`synchronous`), and with two groups whose inference hides
  behind the other group's simulation (`alternating`).
- The peers (`tfaccel.bench.peers`), each left out when it is not installed.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from tfaccel.bench import end_to_end
from tfaccel.bench.peers import PEERS, raw_single_process_sps, timed
from tfaccel.bench.results import git_revision, machine
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.pool import EnvPool

INFERENCE_KINDS = ("none", "synchronous", "alternating", "training")


def raw_parallel_sps(config: AtariConfig, seconds: float, processes: int) -> float:
    """`processes` independent copies of the single-process loop at once, summed.

    No pool and no communication: what the cores deliver together. On a machine whose cores
    share caches, memory bandwidth or a physical core (SMT), this is below processes x single,
    and it is the real ceiling of any parallel sampler there.
    """
    import multiprocessing

    with multiprocessing.get_context("forkserver").Pool(processes) as workers:
        return float(sum(workers.starmap(raw_single_process_sps, [(config, seconds)] * processes)))


def make_policy(spec, batch_size: int) -> Callable[[np.ndarray], np.ndarray]:
    """The paper's policy-gradient network as one compiled call: uint8 [B, H, W, C] -> actions [B]."""
    from tfaccel.commands import tensorflow_started_quietly

    tensorflow_started_quietly()  # no C++ start-up lines where it runs in a notebook
    import tensorflow as tf

    from tfaccel.networks import PolicyValueNetwork

    network = PolicyValueNetwork(spec)
    signature = [tf.TensorSpec([batch_size, *spec.observation.shape], tf.uint8)]

    @tf.function(input_signature=signature, autograph=False)
    def act(observation):
        logits, _ = network(observation)  # [B, A]
        return tf.random.categorical(logits, 1, dtype=tf.int32)[:, 0]  # [B]

    def policy(observation: np.ndarray) -> np.ndarray:
        return act(observation).numpy()

    policy(np.zeros((batch_size, *spec.observation.shape), np.uint8))  # trace outside the timing
    return policy


def pool_sps(
    config: AtariConfig,
    workers: int,
    envs_per_worker: int,
    inference: str,
    seconds: float,
    worker_niceness: int = 0,
) -> dict:
    """Steps an `EnvPool`; actions are random (`none`) or come from the batched policy.

    Returns `sps` and where the time went, per agent step: the caller's CPU (`caller_cpu_us`),
    the workers' CPU (`workers_cpu_us`), and the caller's wall time in `recv` (`wait_us`) and in
    the policy (`policy_us`).
    """
    if inference not in INFERENCE_KINDS:
        raise ValueError(f"inference must be one of {INFERENCE_KINDS}, got {inference!r}")
    groups = 1 if inference == "synchronous" else 2
    with EnvPool(
        config, workers, envs_per_worker, num_groups=groups, seed=0, worker_niceness=worker_niceness
    ) as pool:
        rng = np.random.default_rng(0)
        if inference == "none":
            table = rng.integers(0, pool.spec.num_actions, (64, pool.group_size)).astype(np.int32)
            policy = lambda observation: table[rng.integers(64)]  # noqa: E731
        else:
            policy = make_policy(pool.spec, pool.group_size)
        pool.reset()
        for group in range(groups):
            pool.send(policy(pool.view(group).observation), group)

        clock = {"wait": 0.0, "policy": 0.0}

        def step():
            for group in range(groups):
                start = time.perf_counter()
                observation = pool.recv(group).observation
                middle = time.perf_counter()
                actions = policy(observation)
                clock["wait"] += middle - start
                clock["policy"] += time.perf_counter() - middle
                pool.send(actions, group)
            return pool.num_envs

        timed(step, 0.0, warmup=1.0)
        clock.update(wait=0.0, policy=0.0)
        caller_cpu, workers_cpu = time.process_time(), _cpu_seconds(pool.pids)
        sps = timed(step, seconds, warmup=0.0)
        steps = sps * seconds
        row = {
            "sps": sps,
            "caller_cpu_us": (time.process_time() - caller_cpu) / steps * 1e6,
            "workers_cpu_us": (_cpu_seconds(pool.pids) - workers_cpu) / steps * 1e6,
            "wait_us": clock["wait"] / steps * 1e6,
            "policy_us": clock["policy"] / steps * 1e6,
        }
        for group in range(groups):
            pool.recv(group)
    return row


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds of processes, from /proc (0 where /proc is missing)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def run(
    game: str,
    seconds: float,
    pool_layouts: Sequence[tuple[int, int]],
    inference_layouts: Sequence[tuple[int, int]],
    peer_envs: Sequence[int],
    peers: Sequence[str] = tuple(PEERS),
    worker_niceness: int = 5,
    training_layouts: Sequence[tuple[int, int]] = (),
    log: Callable[[str], None] = print,
) -> dict:
    """Measures everything in one run and returns its JSON (schema: docs/results.md, "Sampler").

    The shared machines drift over minutes, so the single-process limit is measured three times
    (at the start, between the random-action pools and the peers, and at the end) and the median
    is the limit every ratio uses; all three are in the JSON. The lines `log` prints as it goes
    give ratios to the limit measured so far ("x limit so far"); `summary` and the JSON's final
    `raw_limit_sps` give the final ones.
    """
    config = AtariConfig(game=game)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    raws = [raw_single_process_sps(config, seconds)]
    raw = raws[0]
    log(f"raw single process: {raw:,.0f} steps/s; limit for {cpus} cores: {raw * cpus:,.0f}")
    parallel = raw_parallel_sps(config, seconds, cpus)
    log(
        f"{cpus} raw processes at once: {parallel:,.0f} steps/s ({parallel / (raw * cpus):.2f} x limit)"
    )
    result = {
        "game": config.game,
        "obs_shape": list(config.observation_spec.shape),
        "cpus": cpus,
        "seconds": seconds,
        "raw_single_process_sps": raw,
        "raw_limit_sps": raw * cpus,
        "raw_single_process_samples": raws,
        "raw_parallel_sps": parallel,
        "raw_parallel_samples": [parallel],
        "worker_niceness": worker_niceness,
        "results": [],
        "peers": [],
        "command": " ".join(sys.argv),
        "git_revision": git_revision(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    # Peers and random-action pools before TensorFlow is imported, so that nothing of it runs.
    for workers, per_worker in pool_layouts:
        _add_row(
            result,
            log,
            workers,
            per_worker,
            "none",
            pool_sps(config, workers, per_worker, "none", seconds),
        )
    _measure_limit_again(result, raws, config, seconds, cpus, log)
    for name in peers:
        for envs in peer_envs:
            try:
                sps = PEERS[name](config.game, envs, seconds)
            except ImportError as error:
                log(f"{name}: not installed ({error}); left out")
                break
            result["peers"].append({"sampler": name, "envs": envs, "inference": "none", "sps": sps})
            log(
                f"{name:>20} {envs:>4} envs   none         {sps:>8,.0f}  {sps / result['raw_limit_sps']:.2f} x limit so far"
            )
    for workers, per_worker in inference_layouts:
        for kind in ("synchronous", "alternating"):
            row = pool_sps(config, workers, per_worker, kind, seconds, worker_niceness)
            _add_row(result, log, workers, per_worker, kind, row)
    for workers, per_worker in training_layouts:
        row = end_to_end.training_sps(
            config.game, workers, per_worker, 2 * seconds, warmup=min(15.0, 5.0 + seconds)
        )
        _add_row(result, log, workers, per_worker, "training", row)
    _measure_limit_again(result, raws, config, seconds, cpus, log)
    return result


def _measure_limit_again(result, raws, config, seconds, cpus, log) -> None:
    raws.append(raw_single_process_sps(config, seconds))
    raw = float(np.median(raws))
    result["raw_single_process_sps"], result["raw_limit_sps"] = raw, raw * cpus
    log(f"raw single process again: {raws[-1]:,.0f} steps/s; median so far {raw:,.0f}")
    parallel = result.setdefault("raw_parallel_samples", [])
    parallel.append(raw_parallel_sps(config, seconds, cpus))
    result["raw_parallel_sps"] = float(np.median(parallel))
    log(
        f"{cpus} raw processes at once: {parallel[-1]:,.0f} steps/s ({parallel[-1] / (raw * cpus):.2f} x limit so far)"
    )


def _add_row(result, log, workers, per_worker, inference, measured: dict) -> None:
    sps = measured["sps"]
    row = {
        "sampler": "tfaccel",
        "workers": workers,
        "envs_per_worker": per_worker,
        "envs": max(workers, 1) * per_worker,  # 0 workers: the envs step in the trainer
        "inference": inference,
    }
    row.update(measured)
    result["results"].append(row)
    if inference == "training":
        detail = (
            f"wall: env {row['env_fraction']:.0%}, inference {row['inference_fraction']:.0%}, "
            f"learning {row['learn_fraction']:.0%}"
        )
    else:
        detail = (
            f"per step workers {row['workers_cpu_us']:.0f} us cpu, caller "
            f"{row['caller_cpu_us']:.0f} us cpu, policy {row['policy_us']:.0f} us, "
            f"wait {row['wait_us']:.0f} us"
        )
    log(
        f"{'tfaccel':>20} {row['envs']:>4} envs   {inference:<12} {sps:>8,.0f}  "
        f"{sps / result['raw_limit_sps']:.2f} x limit so far   ({workers} workers x {per_worker}; {detail})"
    )


def summary(result: dict) -> dict:
    """The target ratios from one run's JSON: to the limit, to the cores stepping at once, and
    tfaccel's best over each peer's best."""
    limit = result["raw_limit_sps"]
    best_none = max((r["sps"] for r in result["results"] if r["inference"] == "none"), default=0.0)
    best_policy = max(
        (r["sps"] for r in result["results"] if r["inference"] in ("synchronous", "alternating")),
        default=0.0,
    )
    best_training = max(
        (r["sps"] for r in result["results"] if r["inference"] == "training"), default=0.0
    )
    ratios = {
        "best_random_over_limit": best_none / limit,
        "best_inference_over_limit": best_policy / limit,
        "end_to_end_training_over_limit": best_training / limit,
        "parallel_raw_over_limit": result["raw_parallel_sps"] / limit,
        "best_random_over_parallel_raw": best_none / result["raw_parallel_sps"],
        "best_inference_over_parallel_raw": best_policy / result["raw_parallel_sps"],
    }
    for name in PEERS:
        peer = [p["sps"] for p in result["peers"] if p["sampler"] == name]
        if peer:
            ratios[f"best_random_over_{name}"] = best_none / max(peer)
    return ratios


def plot(result: dict, path: str) -> None:
    """Samples/s against the number of envs: the paper's Figure 1 at our scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 5))
    series = {}
    for row in result["results"]:
        label = f"tfaccel, {row['inference']} ({row['workers']} workers)"
        series.setdefault(label, []).append((row["envs"], row["sps"]))
    for row in result["peers"]:
        series.setdefault(row["sampler"], []).append((row["envs"], row["sps"]))
    colors = iter(plt.get_cmap("tab10").colors)
    ordered = sorted(series.items(), key=lambda item: (not item[0].startswith("tfaccel"), item[0]))
    for label, points in ordered:
        points.sort()
        style = "-o" if label.startswith("tfaccel") else "--s"
        axes.plot(*zip(*points, strict=True), style, label=label, color=next(colors))
    axes.axhline(
        result["raw_limit_sps"], color="black", linestyle=":", label="limit (1 process x cores)"
    )
    if "raw_parallel_sps" in result:
        axes.axhline(
            result["raw_parallel_sps"],
            color="gray",
            linestyle="-.",
            label="cores stepping at once, no pool",
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("environments")
    axes.set_ylabel("agent steps per second")
    axes.set_title(
        f"{result['game']} {'x'.join(map(str, result['obs_shape']))}, {result['cpus']} cores"
    )
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
