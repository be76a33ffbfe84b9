#!/usr/bin/env python3
"""How close training runs to what its parts cost: the compute-bound limit of a preset.

    .venv/bin/python benchmarks/compute_bound.py --configs=a2c.gin,ppo.gin,categorical_dqn.gin \
        --json=benchmarks/results/speed/compute_bound__amx.json

For each config, on one game (Pong), in this one run:

1. Each part of an agent step alone, in CPU seconds (this process's, all its threads):
   - `env`: one env of the config stepping with random actions (emulation and preprocessing);
   - `inference`: the config's compiled act call on a batch of one group's envs, divided by
     the batch;
   - `learning`: on-policy, one update on a [horizon, group] rollout (PPO: its epochs x
     minibatches), divided by the rollout's agent steps; off-policy, one update at the config's
     batch times the updates per agent step (replay ratio / batch);
   - `replay` (off-policy): storing one step of a group and drawing one batch (the stacks
     rebuilt, as the prefetch thread does), per agent step.
2. The compute bound: cores / (the sum of the parts), in agent steps per second: what the
   machine could do if nothing but the parts' own work ran, on every core at once.
3. The end-to-end rate: `bin/train` on the config as it ships, in a fresh process, after a
   warm-up (for the Q-value configs, past the replay's warm-up), agent steps per second.

It reports the end-to-end rate as a share of the bound (`x bound`), and of the env-only limit
(cores / env: the pool's ceiling, `x env limit`). Random observations feed the network parts:
their cost does not depend on the pixels. The Q-value configs' replay is built at
--replay_capacity transitions in both measures (sampling cost does not depend on it; the full
1M would need ~8 GiB beside a concurrent run).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gin  # noqa: E402

from tfaccel import api, console, gin_configs, networks, off_policy, on_policy, runner  # noqa: E402
from tfaccel.algorithms import dqn  # noqa: E402
from tfaccel.bench.end_to_end import training_sps  # noqa: E402
from tfaccel.bench.peers import random_steps  # noqa: E402
from tfaccel.bench.results import write_json  # noqa: E402
from tfaccel.distribute import strategies  # noqa: E402
from tfaccel.replay import ReplayBuffer  # noqa: E402
from tfaccel.sampler import compile_act  # noqa: E402
from tfaccel.types import Rollout  # noqa: E402


def cpu_seconds(call, seconds: float) -> float:
    """This process's CPU seconds per call of `call()` (every thread: TensorFlow's pools too),
    over at least `seconds` of wall time, after 3 untimed calls."""
    for _ in range(3):
        call()
    calls, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        call()
        calls += 1
    return (time.process_time() - cpu) / calls


def env_part(env, seconds: float) -> float:
    """CPU seconds of one agent step of `env` (an env factory) with random actions."""
    return cpu_seconds(random_steps(env), seconds)


def arguments(trainer) -> dict:
    """`trainer`'s arguments as the parsed configs bind them, its defaults where they do not."""
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(trainer).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    return {**defaults, **gin.get_bindings(trainer.__name__)}


def observations(spec, *leading: int) -> np.ndarray:
    """Random uint8 frames of `spec`'s shape with leading axes `leading`."""
    shape = (*leading, *spec.observation.shape)
    return np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)


def on_policy_parts(seconds: float) -> dict:
    """CPU seconds per agent step of the parsed on-policy config's inference and learning."""

    args, settings, layout = arguments(on_policy.train), runner.RunConfig(), runner.PoolConfig()
    env, algorithm, horizon = args["env"], args["algorithm"], args["horizon"]
    strategy = _tensorflow(settings)
    spec, group = env(seed=0).spec, layout.group_size
    frames_per_rollout = getattr(env, "frame_skip", 1) * horizon * group
    schedule = on_policy.learning_rate_schedule(
        args["learning_rate"], args["decay_learning_rate"], args["warmup_frames"],
        settings.total_frames, frames_per_rollout, algorithm,
    )  # fmt: skip
    make_network = args["network"] or functools.partial(
        networks.PolicyValueNetwork, torso=args["torso"]
    )
    make_optimizer = args["make_optimizer"]
    agent = on_policy.make_learner(
        lambda: make_network(spec),
        (args["loss_fn"], args["prepare_fn"], args["anneal_clip"]), algorithm,
        lambda: make_optimizer(schedule.rate), schedule, settings.seed, strategy,
    )  # fmt: skip
    act, _, _ = compile_act(agent.network, args["act_fn"], spec, group, settings.seed)
    batch = observations(spec, group)
    rng = np.random.default_rng(0)
    rollout = Rollout(
        observations(spec, horizon, group),
        rng.integers(0, spec.num_actions, (horizon, group)).astype(np.int32),
        rng.choice([-1.0, 0.0, 0.0, 1.0], (horizon, group)).astype(np.float32),
        rng.random((horizon, group)) < 0.01,
        np.zeros((horizon, group), bool),
        np.zeros((horizon, group), np.float32),
        np.full((horizon, group), -np.log(spec.num_actions), np.float32),
        rng.normal(0, 1, (horizon, group)).astype(np.float32),
        observations(spec, group),
    )
    return {
        "inference": cpu_seconds(lambda: act(batch)[0].numpy(), seconds) / group,
        "learning": cpu_seconds(lambda: agent.train(rollout), seconds) / (horizon * group),
        "batch": group,
        "rollout": [horizon, group],
    }


def off_policy_parts(seconds: float, capacity: int) -> dict:
    """CPU seconds per agent step of the parsed Q-value config's inference, replay and
    learning."""

    args = arguments(off_policy.train_off_policy)
    settings, layout = runner.RunConfig(), runner.PoolConfig()
    env, algorithm = args["env"], args["algorithm"]
    batch_size, ratio = args["batch_size"], args["replay_ratio"]
    strategy = _tensorflow(settings)
    spec, group = env(seed=0).spec, layout.group_size
    make_optimizer, learning_rate = args["make_optimizer"], args["learning_rate"]
    agent = off_policy.make_learner(
        spec, (args["torso"], args["dueling"]), algorithm,
        lambda: make_optimizer(float(learning_rate)), settings.seed, strategy,
    )  # fmt: skip
    atoms = dqn.support(algorithm) if algorithm.num_atoms > 1 else None
    act, _, _ = compile_act(
        agent.network, functools.partial(off_policy.act_rule, atoms=atoms), spec, group,
        settings.seed, epsilon=True,
    )  # fmt: skip
    height, width, stack = spec.observation.shape
    replays = [
        ReplayBuffer(
            group,
            capacity // layout.num_groups,
            (height, width),
            stack=stack,
            seed=g,
            n_step=args["n_step"],
            discount=args["discount"],
            prioritized=args["prioritized"],
            alpha=args["priority_alpha"],
            assembly_threads=args["assembly_threads"],
        )  # fmt: skip
        for g in range(layout.num_groups)
    ]
    step = _replay_step(spec, group)
    for replay in replays:  # full, as in a run past its warm-up
        for _ in range(replay.time):
            replay.add(*step)
    batch = observations(spec, group)

    def learn():
        sampled, _ = off_policy.sample_batch(replays, batch_size, 0.5)
        return agent.train(agent.prepare(sampled))

    def draw():
        sampled, _ = off_policy.sample_batch(replays, batch_size, 0.5)
        agent.prepare(sampled)

    updates_per_step = ratio / batch_size
    draw_seconds = cpu_seconds(draw, seconds)
    return {
        "inference": cpu_seconds(lambda: act(batch, np.float32(0.01)).numpy(), seconds) / group,
        "replay": cpu_seconds(lambda: replays[0].add(*step), seconds) / group
        + draw_seconds * updates_per_step,
        "learning": (cpu_seconds(learn, seconds) - draw_seconds) * updates_per_step,
        "batch": group,
        "updates_per_agent_step": updates_per_step,
    }


def _replay_step(spec, group: int) -> tuple:
    """One group's step as `ReplayBuffer.add` takes it: random frames, a game end in 1%."""
    rng = np.random.default_rng(1)
    return (
        observations(spec, group),
        rng.integers(0, spec.num_actions, group).astype(np.int32),
        rng.choice([-1.0, 0.0, 1.0], group).astype(np.float32),
        rng.random(group) < 0.01,
        np.zeros(group, bool),
        observations(spec, group),
    )


def _tensorflow(settings):
    """TensorFlow as the trainers set it up: threads, strategy, precision."""
    strategy = console.set_up_tensorflow(settings.tf_threads, strategies.make_strategy)
    networks.set_precision()
    return strategy


def measure(config: str, game: str, seconds: float, e2e_seconds: float, capacity: int) -> dict:
    """The parts, the bound and the end-to-end rate of one config (see the module docstring)."""
    capacity_binding = f"train_off_policy.replay_capacity = {capacity}"
    gin.clear_config()
    gin_configs.parse([config], [f"AtariConfig.game = '{game}'"])
    trainer = api._trainer_name()
    layout, settings = runner.PoolConfig(), runner.RunConfig()
    parts = {"env": env_part(gin.get_bindings(trainer)["env"], seconds)}
    if trainer == "train":
        details = on_policy_parts(seconds)
    else:
        details = off_policy_parts(seconds, capacity)
    parts.update({name: details.pop(name) for name in ("inference", "replay", "learning")
                  if name in details})  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    bound = cores / sum(parts.values())
    end_to_end = training_sps(
        game, layout.num_workers, layout.envs_per_worker, e2e_seconds, config,
        layout.num_groups, warmup=60.0 if trainer != "train" else 20.0, trainer=trainer,
        extra_bindings=(capacity_binding,) if trainer != "train" else (),
    )  # fmt: skip
    row = {
        "config": config,
        "game": game,
        "trainer": trainer,
        "cores": cores,
        "layout": {
            "workers": layout.num_workers,
            "envs_per_worker": layout.envs_per_worker,
            "groups": layout.num_groups,
        },  # fmt: skip
        "tf_threads": settings.tf_threads,
        "cpu_us_per_agent_step": {name: value * 1e6 for name, value in parts.items()},
        **details,
        "bound_sps": bound,
        "env_limit_sps": cores / parts["env"],
        "sps": end_to_end["sps"],
        "x_bound": end_to_end["sps"] / bound,
        "x_env_limit": end_to_end["sps"] * parts["env"] / cores,
        "time_split": {
            name: end_to_end[f"{name}_fraction"] for name in ("env", "inference", "learn")
        },  # fmt: skip
    }
    split = "  ".join(f"{name} {value * 1e6:.0f}" for name, value in parts.items())
    print(
        f"{config}: CPU us per agent step: {split}; bound {bound:,.0f} steps/s; end to end "
        f"{row['sps']:,.0f} = {row['x_bound']:.2f} x bound, {row['x_env_limit']:.3f} x env limit",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="a2c.gin,ppo.gin,categorical_dqn.gin")
    parser.add_argument("--game", default="pong")
    parser.add_argument("--seconds", type=float, default=8.0, help="per part")
    parser.add_argument("--e2e_seconds", type=float, default=60.0, help="end to end, measured")
    parser.add_argument("--replay_capacity", type=int, default=200_000)
    parser.add_argument("--json", default=None)
    flags = parser.parse_args()
    rows = [
        measure(config, flags.game, flags.seconds, flags.e2e_seconds, flags.replay_capacity)
        for config in flags.configs.split(",")
    ]
    if flags.json:
        write_json(flags.json, {"results": rows})


if __name__ == "__main__":
    main()
