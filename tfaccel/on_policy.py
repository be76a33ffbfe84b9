"""The on-policy trainer (A2C, PPO; A3C and APPO through `distribute.asynchronous`): collect a
rollout from the alternating env groups, train on it, log / checkpoint / export, resumable.

`train(root_dir)` reads every setting from gin (configs in gin_configs/). Running it again on the
same `root_dir` resumes from the last checkpoint: network, optimizer slots and schedule position,
counters, wall time and the policy's random generator continue; `metrics.csv` is appended to.
The envs start new games on resume (emulator states are not checkpointed). The loop's
bookkeeping (stopping, logging, checkpoints) is `runner.Loop`, shared with the off-policy trainer.
"""

from __future__ import annotations

import functools
import time

import gin

from tfaccel import console, learner, networks, runner
from tfaccel import run_dir as run_dirs
from tfaccel.distribute import strategies
from tfaccel.envs.pool import PoolError
from tfaccel.guards import DeadNetworkWatch, NonFiniteGuard, StopRequest, report_faults, saved_on
from tfaccel.sampler import OnPolicySampler, compile_act
from tfaccel.types import Rollout, check_range


@gin.configurable(denylist=["root_dir", "run_config", "pool_config", "team"])
def train(
    root_dir: str,
    env=gin.REQUIRED,
    loss_fn=gin.REQUIRED,
    act_fn=gin.REQUIRED,
    algorithm=gin.REQUIRED,
    prepare_fn=None,
    anneal_clip: bool = False,
    torso=networks.a3c_torso,
    network=None,
    make_optimizer=learner.make_rmsprop,
    learning_rate: float = 7e-4,
    decay_learning_rate: bool = True,
    warmup_frames: int = 0,
    horizon: int = 5,
    eval_epsilon: float = 0.0,
    run_config: runner.RunConfig | None = None,
    pool_config: runner.PoolConfig | None = None,
    team=None,
) -> dict:
    """Trains an on-policy agent; see the module docstring. Returns the final summary.

    The settings every trainer shares are `runner.RunConfig` (frames, intervals, evaluation,
    wall limit, seed, threads) and `runner.PoolConfig` (workers, envs, groups), bound once in gin
    (`RunConfig.total_frames = ...`) or passed from Python (`run_config=RunConfig(...)`).

    Args:
        root_dir: the run directory (created; reused to resume).
        env: env factory, e.g. `@AtariConfig()`.
        loss_fn: the algorithm's `loss(network, rollout, config)`, e.g. `@a2c_loss`.
        act_fn: the algorithm's act rule, e.g. `@a2c_act`.
        algorithm: the algorithm's hyperparameters, e.g. `@A2CConfig()`. Its `max_grad_norm`,
            `epochs` and `minibatches` (where it has them) drive the learner.
        prepare_fn: for several SGD steps per rollout, `(network, rollout, algorithm) -> samples`
            (`@ppo_samples`); None: one step on the whole rollout.
        anneal_clip: pass `clip = algorithm.clip x (current / initial learning rate)` to the loss
            (PPO's clip annealing, on the learning rate's schedule).
        torso: network torso factory (`@a3c_torso`, `@nature_torso`).
        network: `spec -> keras.Model` for a network of your own (it returns `(logits [B, A],
            value [B])` like `PolicyValueNetwork`); None: `PolicyValueNetwork` on `torso`.
        make_optimizer: `learning_rate -> optimizer` (`@make_rmsprop`, `@make_adam`).
        learning_rate: initial learning rate.
        decay_learning_rate: anneal it linearly to 0 over `RunConfig.total_frames`.
        warmup_frames: raise it linearly from 0 over this many env frames first (0: none; see
            `learner.warm_up`); a decay still runs over all of `total_frames`.
        horizon: steps per rollout (t_max).
        eval_epsilon: epsilon-greedy exploration of the evaluation games
            (`RunConfig.eval_episodes`).
        run_config: the run's `RunConfig` (None: as gin binds it).
        pool_config: the run's `PoolConfig` (None: as gin binds it).
        team: the processes training together, when not this process alone or the workers of
            the strategy (`tfaccel.distribute.asynchronous.AsyncTeam`; not a gin setting).
    """
    settings, layout = run_config or runner.RunConfig(), pool_config or runner.PoolConfig()
    NonFiniteGuard.check_action(settings.on_nonfinite)  # before anything starts
    learner.check_positive(learning_rate, "train.learning_rate", "7e-4")
    check_range(warmup_frames, "train.warmup_frames", 0)
    check_range(eval_epsilon, "train.eval_epsilon", 0, 1)  # even with no evaluation games
    _check_algorithm(loss_fn, algorithm)
    strategy = console.set_up_tensorflow(settings.tf_threads, strategies.make_strategy)
    precision = networks.set_precision()  # gin: set_precision.policy
    strategies.check_split(strategy, layout.group_size, "the number of envs per group")
    _check_rollout(horizon, layout.group_size, strategies.local_replicas(strategy), algorithm)
    # Several processes (multi-worker or asynchronous learners): each runs this on its own envs;
    # the chief owns root_dir, the others keep their state in their own directory below it.
    team = team or strategies.SyncTeam(strategy)
    learners, chief, seed = team.learners, team.chief, team.seed(settings.seed)
    run_dir, log, eval_log = run_dirs.open_run(
        root_dir, team, precision, strategies.describe(strategy)
    )
    frame_skip = getattr(env, "frame_skip", 1)
    with run_dirs.held(run_dir), runner.make_pool(env, seed, layout) as pool:
        frames_per_rollout = frame_skip * horizon * pool.group_size * learners
        schedule = learning_rate_schedule(
            learning_rate, decay_learning_rate, warmup_frames, settings.total_frames,
            frames_per_rollout, algorithm,
        )  # fmt: skip
        make_network = network or functools.partial(networks.PolicyValueNetwork, torso=torso)
        agent = make_learner(
            lambda: _built(make_network, pool.spec, own=network is not None),
            (loss_fn, prepare_fn, anneal_clip), algorithm,
            lambda: make_optimizer(schedule.rate), schedule, seed, strategy,
        )  # fmt: skip
        act, value, generator = compile_act(agent.network, act_fn, pool.spec, pool.group_size, seed)
        counters, saver, restored = run_dirs.checkpoints(
            run_dir, (log, eval_log), frame_skip, team, network=agent.network,
            optimizer=agent.optimizer, generator=generator, learner_generator=agent.generator,
        )  # fmt: skip
        runner.set_frame_offsets([agent.network], env, seed, log, resumed=restored is not None)
        agent = team.attach(agent, counters)
        sampler = OnPolicySampler(pool, act, value, horizon)
        atari = run_dirs.atari_of(env, settings.eval_episodes, chief and log)

        def save(frames: int, wall_s: float) -> None:
            team.before_save(agent)
            saver.save(frames)
            if chief:
                run_dirs.publish_policy(
                    agent.network, atari, root_dir, (log, eval_log), frames, frame_skip, wall_s,
                    settings.eval_episodes, eval_epsilon, seed,
                )  # fmt: skip

        loop = runner.Loop(counters, frame_skip, settings, log, team, sampler, save,
                           columns=lambda: {"learning_rate": agent.learning_rate})  # fmt: skip
        guard = NonFiniteGuard(settings.on_nonfinite, agent, saver, log, team)
        return _loop(loop, sampler, agent, team, guard, log)


class _Schedule:
    """The learning rate of an on-policy run: `rate` (what the optimizer takes: a float or a
    schedule of optimizer steps), `initial` (the rate set) and `decay` (the linear decay alone,
    without the warm-up; None when the rate is constant), which PPO's clip annealing follows."""

    def __init__(self, rate, initial: float, decay):
        self.rate, self.initial, self.decay = rate, initial, decay


def learning_rate_schedule(
    learning_rate, decay, warmup_frames, total_frames, frames_per_rollout, algorithm
):
    """The run's learning rate (`_Schedule`). It counts optimizer steps: PPO takes epochs x
    minibatches of them per rollout of `frames_per_rollout` env frames (every learner's)."""
    steps_per_rollout = getattr(algorithm, "epochs", 1) * getattr(algorithm, "minibatches", 1)
    decay_fn = (
        learner.linear_decay(
            learning_rate, -(-total_frames // frames_per_rollout) * steps_per_rollout
        )  # over every rollout the run takes, the last one part-way too
        if decay
        else None
    )
    warmup_steps = warmup_frames // frames_per_rollout * steps_per_rollout
    rate = learner.warm_up(decay_fn or float(learning_rate), warmup_steps)
    return _Schedule(rate, learning_rate, decay_fn)


def _built(make_network, spec, own: bool = False):
    """`make_network(spec)`'s model with its variables made (a network of the user's may make
    them at its first call; the optimizer is built on them first) and `spec` set where it has
    none (the export reads the observation's shape from it).

    A network of the user's (`own`) is made in float32 whatever the precision: under
    `mixed_bfloat16` its heads would return bfloat16, where the losses take float32 (tfaccel's
    own networks keep their heads in float32; a user's layers that set their own dtype policy
    keep it)."""
    import keras
    import numpy as np

    precision = keras.mixed_precision.global_policy()
    if own:
        keras.mixed_precision.set_global_policy("float32")
    try:
        model = make_network(spec)
        if not model.built:
            model(np.zeros((1, *spec.observation.shape), spec.observation.dtype))
    finally:
        keras.mixed_precision.set_global_policy(precision)
    if getattr(model, "spec", None) is None:
        model.spec = spec
    return model


def make_learner(make_network, algorithm_fns, algorithm, make_optimizer, schedule, seed,
                 strategy) -> learner.Learner:  # fmt: skip
    """The learner of an on-policy algorithm: `algorithm_fns` are its loss, its `prepare_fn`
    (or None) and whether the loss's clip anneals with the learning rate's decay (PPO's)."""
    loss_fn, prepare_fn, anneal_clip = algorithm_fns
    decay, initial = schedule.decay, schedule.initial

    def algorithm_loss(network, batch):
        if not anneal_clip:
            return loss_fn(network, batch, algorithm)
        # 1 -> 0 with the decay (not the warm-up): the clip starts at its full value
        progress = decay(agent.optimizer.iterations) / initial if decay else 1.0
        return loss_fn(network, batch, algorithm, clip=algorithm.clip * progress)

    agent = learner.Learner(
        make_network,
        algorithm_loss,
        make_optimizer,
        max_grad_norm=getattr(algorithm, "max_grad_norm", 0.0),
        prepare_fn=prepare_fn and (lambda network, batch: prepare_fn(network, batch, algorithm)),
        epochs=getattr(algorithm, "epochs", 1),
        minibatches=getattr(algorithm, "minibatches", 1),
        seed=seed,
        strategy=strategy,
        batch_axes=Rollout.env_axes(),
    )
    return agent


def _check_algorithm(loss_fn, algorithm) -> None:
    """Raises a one-line ValueError when `loss_fn` is one of tfaccel's losses (as gin binds it,
    or itself) and `algorithm` is not the config it takes: `train.loss_fn = @ppo_loss` over
    a2c.gin's `A2CConfig` failed in the first update with an AttributeError. A loss of the
    user's, or a wrapper of one of tfaccel's, is not checked."""
    from tfaccel.algorithms import a2c, ppo

    loss = getattr(loss_fn, "__wrapped__", loss_fn)  # gin's configurable wraps it once
    takes = ((a2c.loss, a2c.A2CConfig), (ppo.loss, ppo.PPOConfig))
    wanted = next((config for fn, config in takes if fn is loss or fn is loss_fn), None)
    if wanted is not None and not isinstance(algorithm, wanted):
        raise ValueError(
            f"train.loss_fn takes a {wanted.__name__} and train.algorithm is "
            f"{type(algorithm).__name__}: bind train.algorithm = @{wanted.__name__}(), or start "
            "from the config of the algorithm you want (a2c.gin, ppo.gin, ...)"
        )


def _check_rollout(horizon: int, group_size: int, replicas: int, algorithm) -> None:
    """Raises a one-line ValueError for a rollout the learner cannot use whole (each of the
    `replicas` trains on its share of a group's envs)."""
    epochs, minibatches = getattr(algorithm, "epochs", 1), getattr(algorithm, "minibatches", 1)
    kind = type(algorithm).__name__
    for name, value in (
        ("train.horizon", horizon), (f"{kind}.epochs", epochs),
        (f"{kind}.minibatches", minibatches),
    ):  # fmt: skip
        if value < 1:
            raise ValueError(f"{name} is {value}; it must be 1 or more")
    envs = group_size // replicas
    samples = horizon * envs
    if samples % minibatches:
        share = f" / {replicas} replicas" if replicas > 1 else ""
        raise ValueError(
            f"a rollout of {samples} samples per replica (train.horizon {horizon} x {envs} envs: "
            f"PoolConfig.num_workers x envs_per_worker / num_groups{share}) does not split into "
            f"{kind}.minibatches = {minibatches}: make the rollout a multiple of {minibatches}, "
            f"or choose a divisor of {samples}"
        )


def _loop(loop, sampler, agent, team, guard, log) -> dict:
    """The run itself, top to bottom: collect, train, report, save; stop on time or on a signal.

    `team` counts the agent steps of every process training together and makes them stop
    together (`team.stop(flag)` is True on all of them once any of them asks).
    """
    with StopRequest() as stop, saved_on(PoolError, loop.save_if_behind):
        if loop.complete():
            return loop.finish(stop)
        to_go, envs = loop.settings.total_frames - loop.frames, sampler.pool.num_envs
        where = f"{envs} envs" if team.learners == 1 else f"{team.learners} x {envs} envs"
        log.message(
            f"training on {where}, {to_go:,} frames to go (from {loop.frames:,}); learning from "
            "the first rollout"
        )
        watch = DeadNetworkWatch(log)
        for _, rollout in sampler.rollouts():
            tick = time.perf_counter()
            metrics = agent.train(rollout)
            loop.learn_seconds += time.perf_counter() - tick
            report_faults(sampler.pool, log)
            agent_steps = team.agent_steps(loop.base_steps, sampler.agent_steps)  # every process's
            loop.counters.updates.assign_add(1)
            loop.advance(sampler.drain_games(), agent_steps, metrics)
            guard.check(metrics, loop.frames)
            watch.check(metrics, loop.frames)
            if loop.should_stop(stop):
                break
            loop.tick()
        return loop.finish(stop)
