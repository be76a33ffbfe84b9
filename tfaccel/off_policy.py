"""The off-policy run of the DQN family: act epsilon-greedily, store in replay, train from replay.

`train_off_policy(root_dir)` is selected in gin with `run.trainer = @train_off_policy` and shares
the run directory, resume, export and the loop's bookkeeping (`runner.Loop`) with the on-policy
trainer. The training intensity is held fixed as the number of envs changes: `replay_ratio`
gradient samples per agent step (the Nature DQN: a batch of 32 every 4 agent steps = 8), as in the
Accelerated Methods paper. Batches are drawn by a background thread while the learner trains
(`prefetch`), and the importance exponent beta of prioritized replay anneals linearly to 1 over
the run (Schaul et al., 2016).
The replay memory is checkpointed only on request (`checkpoint_replay`: at 1M transitions it is
8.3 GB); otherwise a resumed run refills it (`min_replay_steps`) before learning again.
"""

from __future__ import annotations

import contextlib
import functools
import time

import gin
import numpy as np
import tensorflow as tf

from tfaccel import console, learner, networks, replay_files, runner
from tfaccel import run_dir as run_dirs
from tfaccel.algorithms import dqn
from tfaccel.distribute import strategies
from tfaccel.envs.pool import PoolError
from tfaccel.guards import DeadNetworkWatch, NonFiniteGuard, StopRequest, report_faults, saved_on
from tfaccel.prefetch import Prefetcher
from tfaccel.replay import ReplayBatch, ReplayBuffer, available_memory, memory_needed
from tfaccel.sampler import ReplaySampler, compile_act
from tfaccel.types import check_range


def act_rule(network, observation, generator, epsilon, atoms):
    """The DQN family's act rule in the order `sampler.compile_act` passes its inputs."""
    return dqn.act(network, observation, epsilon, generator, atoms)


def sample_batch(replays, batch_size: int, beta: float) -> tuple[ReplayBatch, list[int]]:
    """An equal share of the batch from each group's buffer; the stacks of every share are
    assembled in place in the batch's arrays (concatenating them after costs as much again).

    Prioritized: a transition of group g is drawn with probability P_g(i) / G per draw, so its
    importance weight is (N * P_g(i) / G)^-beta (N: the valid transitions of all groups),
    normalized by the largest of the whole batch, as one buffer of all groups would weigh it.
    """
    share = batch_size // len(replays)
    sizes = [len(replay) for replay in replays]
    first = replays[0]
    shape = (share * len(replays), *first.frame_shape, first.stack)
    stacks = np.empty(shape, np.uint8), np.empty(shape, np.uint8)  # each share in place
    parts = [
        replay.sample(share, beta, False, [whole[g * share : (g + 1) * share] for whole in stacks])
        for g, replay in enumerate(replays)
    ]
    stacked = {"observation": stacks[0], "next_observation": stacks[1]}
    batch = ReplayBatch(**{
        name: stacked[name] if name in stacked else np.concatenate(values)
        for name, values in zip(ReplayBatch._fields, zip(*parts, strict=True), strict=True)
    })  # fmt: skip
    if replays[0].prioritized:  # the parts' weights are (N_g * P_g(i))^-beta
        scale = [(sum(sizes) / (len(replays) * size)) ** -beta for size in sizes]
        weight = batch.weight * np.repeat(np.asarray(scale, np.float32), share)
        batch = batch._replace(weight=(weight / weight.max()).astype(np.float32))
    return batch, [share] * len(replays)


@gin.configurable(denylist=["root_dir", "run_config", "pool_config"])
def train_off_policy(
    root_dir: str,
    env=gin.REQUIRED,
    algorithm=gin.REQUIRED,
    torso=networks.nature_torso,
    dueling: bool = False,
    make_optimizer=learner.make_adam,
    learning_rate: float = 6.25e-5,
    replay_capacity: int = 1_000_000,
    n_step: int = 1,
    discount: float = 0.99,
    prioritized: bool = False,
    priority_alpha: float = 0.5,
    priority_beta: float = 0.4,
    anneal_beta: bool = True,
    batch_size: int = 32,
    replay_ratio: float = 8.0,
    min_replay_steps: int = 20_000,
    prefetch: bool = True,
    assembly_threads: int = 2,
    checkpoint_replay: bool = False,
    run_config: runner.RunConfig | None = None,
    pool_config: runner.PoolConfig | None = None,
) -> dict:
    """Trains a DQN-family agent from replay; see the module docstring.

    The settings every trainer shares are `runner.RunConfig` (frames, intervals, evaluation,
    wall limit, seed, threads) and `runner.PoolConfig` (workers, envs, groups; one replay buffer
    per group), bound once in gin (`RunConfig.total_frames = ...`) or passed from Python
    (`run_config=RunConfig(...)`).

    Args:
        root_dir: the run directory (created; reused to resume).
        env: env factory, e.g. `@AtariConfig()`.
        algorithm: `@DQNConfig()`: loss options, epsilon schedule, target period.
        torso: network torso factory (`@nature_torso`, `@a3c_torso`).
        dueling: dueling heads (Wang et al., 2016).
        make_optimizer: `learning_rate -> optimizer`.
        learning_rate: the optimizer's learning rate (constant).
        replay_capacity: transitions kept, over all envs.
        n_step: steps of the n-step return.
        discount: gamma.
        prioritized: prioritized replay (Schaul et al., 2016).
        priority_alpha: priority exponent alpha.
        priority_beta: importance-sampling exponent beta at the start.
        anneal_beta: beta grows linearly to 1 over `RunConfig.total_frames` (else it stays
            constant).
        batch_size: samples per gradient step.
        replay_ratio: gradient samples per agent step (training intensity).
        min_replay_steps: agent steps stored before learning starts.
        prefetch: draw batches in a background thread while the learner trains (False: draw
            each batch when it is needed; the run is then a function of the seed on a
            deterministic env).
        assembly_threads: threads that rebuild a batch's stacked observations from the replay's
            frames (`ReplayBuffer`; batches of 64 and more): a batch of 512 takes 3.4 ms with 2
            threads against 6.3 ms with 1 on 2 cores (benchmarks/replay_memory.py).
        checkpoint_replay: save the replay memory with each checkpoint and restore it on resume
            (a resumed run then learns on at once instead of refilling); one file, the latest.
        run_config: the run's `RunConfig` (None: as gin binds it).
        pool_config: the run's `PoolConfig` (None: as gin binds it).
    """
    settings, layout = run_config or runner.RunConfig(), pool_config or runner.PoolConfig()
    NonFiniteGuard.check_action(settings.on_nonfinite)  # before anything starts
    learner.check_positive(learning_rate, "train_off_policy.learning_rate", "7e-4")
    for name, value, low, high in (("batch_size", batch_size, 1, None), ("n_step", n_step, 1, None),
                                   ("discount", discount, 0, 1),
                                   ("assembly_threads", assembly_threads, 1, None)):  # fmt: skip
        check_range(value, f"train_off_policy.{name}", low, high)
    if not replay_ratio > 0:  # 0 or NaN: no update would ever be due
        raise ValueError(
            f"train_off_policy.replay_ratio must be more than 0 (gradient samples per agent "
            f"step; the presets take 8), got {replay_ratio!r}"
        )
    strategy = console.set_up_tensorflow(settings.tf_threads, strategies.make_strategy)
    precision = networks.set_precision()  # gin: set_precision.policy
    strategies.check_split(strategy, batch_size, "train_off_policy.batch_size")
    # Several machines: as in `on_policy.train`, each worker acts and replays on its own envs.
    team = strategies.SyncTeam(strategy)
    chief, seed = team.chief, team.seed(settings.seed)
    run_dir, log, eval_log = run_dirs.open_run(
        root_dir, team, precision, strategies.describe(strategy)
    )
    frame_skip = getattr(env, "frame_skip", 1)
    atoms = dqn.support(algorithm) if algorithm.num_atoms > 1 else None
    with run_dirs.held(run_dir), runner.make_pool(env, seed, layout) as pool:
        replays = _make_replays(
            pool, replay_capacity, layout.num_groups, batch_size, min_replay_steps, seed,
            n_step=n_step, discount=discount, prioritized=prioritized, alpha=priority_alpha,
            assembly_threads=assembly_threads,
        )  # fmt: skip
        agent = make_learner(
            pool.spec, (torso, dueling), algorithm,
            lambda: make_optimizer(float(learning_rate)), seed, strategy,
        )  # fmt: skip
        act, _, generator = compile_act(
            agent.network, functools.partial(act_rule, atoms=atoms), pool.spec,
            pool.group_size, seed, epsilon=True,
        )  # fmt: skip
        counters, saver, restored = run_dirs.checkpoints(
            run_dir, (log, eval_log), frame_skip, team, network=agent.network,
            target=agent.target, optimizer=agent.optimizer, generator=generator,
        )  # fmt: skip
        runner.set_frame_offsets(
            [agent.network, agent.target], env, seed, log, resumed=restored is not None
        )
        if restored and checkpoint_replay:
            loaded = replay_files.restore(saver.directory, restored, replays)
            log.message("replay restored" if loaded else "no replay saved with it: refilling")
        atari = run_dirs.atari_of(env, settings.eval_episodes, chief and log)
        publish = chief and (
            lambda frames, wall_s: run_dirs.publish_policy(
                agent.network, atari, root_dir, (log, eval_log), frames, frame_skip, wall_s,
                settings.eval_episodes, algorithm.eval_epsilon, seed, **_export_head(atoms),
            )
        )  # fmt: skip
        save = _saving(saver, replays if checkpoint_replay else None, log, publish)
        sampler = ReplaySampler(pool, act, replays)
        learning = _ReplayLearning(
            agent, replays, batch_size, replay_ratio, prioritized,
            (priority_beta, anneal_beta, settings.total_frames), prefetch,
        )  # fmt: skip
        loop = runner.Loop(
            counters, frame_skip, settings, log, team, sampler, save, note=learning.note,
            columns=lambda: learning.columns(
                dqn.epsilon(algorithm, loop.frames // frame_skip), loop.learn_seconds
            ),
        )  # fmt: skip
        guards = (
            NonFiniteGuard(settings.on_nonfinite, agent, saver, log, team),
            DeadNetworkWatch(log),
        )
        return _loop(loop, sampler, agent, learning, algorithm, min_replay_steps, team, guards)


def _saving(saver, replays, log, publish):
    """The trainer's `save(frames, wall_s)`: the replay first (unless `replays` is None), so a
    save cut midway resumes from the checkpoint before with its replay; a replay that cannot be
    written (a full disk) still lets the checkpoint be. Then the checkpoint, and
    `publish(frames, wall_s)` where it is given (the chief's exported policy)."""

    def save(frames: int, wall_s: float) -> None:
        saved = replays is not None and replay_files.save(saver.directory, frames, replays, log)
        saver.save(frames)
        if saved:
            replay_files.prune(saver.directory, frames)
        if publish:
            publish(frames, wall_s)

    return save


def _loop(loop, sampler, agent, learning, algorithm, min_replay_steps, team, guards) -> dict:
    """The run itself, top to bottom: act, store, train as the replay ratio says, sync the
    target; log and save; stop on time or on a signal (every process of the team together)."""
    period, warm = algorithm.target_update_period, False
    # Target syncs happen as the agent steps cross multiples of the period, so a resumed run
    # keeps the target network of its checkpoint and syncs where the unbroken run would.
    synced = loop.base_steps // period
    with StopRequest() as stop:
        if loop.complete():
            return loop.finish(stop)
        # A replay restored with the checkpoint learns at once: no word of filling it.
        if sum(len(replay) for replay in learning.replays) < min_replay_steps:
            loop.log.message(
                f"filling the replay: learning starts when each process holds "
                f"{min_replay_steps:,} transitions ({sampler.pool.num_envs} envs here; "
                f"{loop.settings.total_frames - loop.frames:,} frames to go)"
            )
        with contextlib.ExitStack() as cleanup:  # the prefetcher stops before the last save
            cleanup.enter_context(saved_on(PoolError, loop.save_if_behind))
            while not loop.should_stop(stop):
                steps = team.agent_steps(loop.base_steps, sampler.agent_steps)
                sampler.step(dqn.epsilon(algorithm, steps))
                stored = sum(len(replay) for replay in learning.replays)
                # Every worker holds min_replay_steps transitions: they start learning together.
                warm = warm or not team.stop(stored < min_replay_steps)
                tick = time.perf_counter()
                metrics = learning.train(warm, sampler.pool.num_envs, loop.frames, cleanup, guards)
                loop.learn_seconds += time.perf_counter() - tick
                steps = team.agent_steps(loop.base_steps, sampler.agent_steps)
                if steps // period > synced:
                    agent.sync_target()
                    synced = steps // period
                report_faults(sampler.pool, loop.log)
                loop.advance(sampler.drain_games(), steps, metrics)
                loop.tick()
        return loop.finish(stop)


class _ReplayLearning:
    """When the learner trains from replay, and on what: the SGD steps the replay ratio owes
    once learning started, beta's annealing, the batches (drawn when needed, or by a
    `Prefetcher` thread while the learner trains) and the priorities each step updates."""

    def __init__(self, agent, replays, batch_size, replay_ratio, prioritized, beta, prefetch):
        self.agent, self.replays, self.batch_size = agent, replays, batch_size
        self.replay_ratio, self.prioritized, self.prefetch = replay_ratio, prioritized, prefetch
        self.beta_start, self.anneal_beta, self.total_frames = beta
        self.beta = self.beta_start
        self.due = 0.0  # train steps owed to the replay ratio
        self.wait_seconds = 0.0  # waiting for batches
        self._prefetcher = None

    def columns(self, epsilon: float, learn_seconds: float) -> dict:
        """The off-policy columns of a metrics row (`priority_beta` with prioritized replay
        only: it weighs nothing without it)."""
        row = {
            "epsilon": epsilon,
            "replay_size": sum(len(replay) for replay in self.replays),
            "replay_wait_fraction": self.wait_seconds / max(learn_seconds, 1e-9),
        }
        return row | ({"priority_beta": self.beta} if self.prioritized else {})

    def note(self) -> str:
        """What the progress line shows after the score."""
        return f"  replay {sum(len(replay) for replay in self.replays):,}"

    def draw(self) -> tuple[np.ndarray, list[int], ReplayBatch]:
        batch, shares = sample_batch(self.replays, self.batch_size, self.beta)
        return batch.index, shares, self.agent.prepare(batch)

    def train(self, warm: bool, num_envs: int, frames: int, cleanup, guards) -> dict | None:
        """The SGD steps owed after an agent step of `num_envs` envs; the last one's metrics
        (None: no step). `cleanup` (an ExitStack) stops the prefetcher at the end of the run."""
        if warm:
            self.due += num_envs * self.replay_ratio / self.batch_size
        if self.anneal_beta:
            progress = min(frames / self.total_frames, 1.0)
            self.beta = self.beta_start + (1.0 - self.beta_start) * progress
        if self.prefetch and self._prefetcher is None and self.due >= 1.0:
            self._prefetcher = cleanup.enter_context(Prefetcher(self.draw))
        metrics = None
        while self.due >= 1.0:
            metrics = self._train_once(self._prefetcher.get if self._prefetcher else self.draw)
            for guard in guards:
                guard.check(metrics, frames)
            self.due -= 1.0
        return metrics

    def _train_once(self, next_batch) -> dict:
        """One gradient step on the next batch (drawn equally from every group's buffer);
        updates the priorities of its transitions."""
        tick = time.perf_counter()
        index, shares, batch = next_batch()  # batch: as the learner takes it (Learner.prepare)
        self.wait_seconds += time.perf_counter() - tick
        metrics = self.agent.train(batch)
        priority = metrics.pop("priority")
        if self.prioritized and not metrics["skipped_updates"]:  # a skipped step's may be NaN
            cuts = np.cumsum(shares)[:-1]
            for replay, part, value in zip(
                self.replays, np.split(index, cuts), np.split(priority, cuts), strict=True
            ):
                replay.update_priorities(part, value)
        return metrics


def make_learner(spec, torso, algorithm, make_optimizer, seed, strategy) -> learner.Learner:
    """The learner of a Q-value network with a target network (`torso`: the torso factory and
    whether the heads are dueling)."""
    torso, dueling = torso

    def make_network():
        return networks.QNetwork(spec, torso=torso, dueling=dueling, num_atoms=algorithm.num_atoms)

    def loss_fn(network, batch):
        return dqn.loss(network, batch, algorithm, target=agent.target)

    agent = learner.Learner(
        make_network, loss_fn, make_optimizer, max_grad_norm=algorithm.max_grad_norm,
        target_network=True, seed=seed, strategy=strategy,
    )  # fmt: skip
    return agent


def _make_replays(pool, capacity, num_groups, batch_size, min_replay_steps, seed, **options):
    """One `ReplayBuffer` per env group (`options`: its n-step, discount, priorities and
    assembly threads), after checking that this env, memory and batch suit them.

    Raises:
        ValueError: observations that are not uint8 frames; more memory than the machine has
            available; a batch that does not split among the groups; a warm-up never reached.
    """
    observation = pool.spec.observation
    if len(observation.shape) != 3 or observation.dtype != np.uint8:
        raise ValueError(
            "the replay stores uint8 frames [H, W, stack], one frame per step; this env "
            f"observes {observation.dtype} {list(observation.shape)}: train it on-policy "
            "(a2c.gin, ppo.gin)"
        )
    height, width, stack = observation.shape
    # Each group's ring holds capacity // num_groups // group_size steps per env, and needs
    # more than n_step + stack of them (ReplayBuffer).
    smallest = (options["n_step"] + stack + 1) * pool.group_size * num_groups
    if capacity < smallest:
        raise ValueError(
            f"train_off_policy.replay_capacity = {capacity:,} is too small for "
            f"{pool.num_envs} envs: give at least {smallest:,} ((n_step + stack + 1) steps per "
            "env)"
        )
    needed = num_groups * memory_needed(pool.group_size, capacity // num_groups, (height, width))
    available = available_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"a replay of {capacity:,} transitions of {height}x{width} frames needs "
            f"{needed / 2**30:.1f} GiB, and this machine has {available / 2**30:.1f} GiB "
            "available: lower train_off_policy.replay_capacity"
        )
    replays = [
        ReplayBuffer(
            pool.group_size,
            capacity // num_groups,
            (height, width),
            stack=stack,
            seed=seed + g,
            **options,
        )  # fmt: skip
        for g in range(num_groups)
    ]
    if batch_size % num_groups:
        raise ValueError(
            f"train_off_policy.batch_size = {batch_size} does not split into {num_groups} "
            "equal shares (one from each group's replay): use a multiple of PoolConfig.num_groups"
        )
    # A full ring still has its newest n steps and its oldest stack - 1 incomplete.
    n_step = options["n_step"]
    reachable = sum((r.time - n_step - stack) * r.num_envs for r in replays)
    if min_replay_steps > reachable:
        raise ValueError(
            f"train_off_policy.min_replay_steps = {min_replay_steps:,} is never reached: a "
            f"replay of {capacity:,} transitions on {pool.num_envs} envs holds at "
            f"most {reachable:,} complete ones; lower min_replay_steps or raise "
            "replay_capacity"
        )
    return replays


def _export_head(atoms) -> dict:
    """What the exported policy's signature returns: Q-values, or C51's probabilities over
    `atoms` (see `export.export_policy`)."""
    if atoms is None:
        return dict(head="q_values", head_fn=lambda output: ("q_values", output))
    return dict(
        head="probabilities",
        head_fn=lambda output: ("probabilities", tf.nn.softmax(output, -1)),
        support=atoms.numpy(),
    )
