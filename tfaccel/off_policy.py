"""The off-policy run of the DQN family: act epsilon-greedily, store in replay, train from replay.

`train_off_policy(root_dir)` is selected in gin with `run.trainer = @train_off_policy` and shares
the run directory, logging, checkpoints, export and resume of `tfaccel.runner`. The training
intensity is held fixed as the number of envs changes: `replay_ratio` gradient samples per agent
step (the Nature DQN: a batch of 32 every 4 agent steps = 8), as in the Accelerated Methods paper.
Batches are drawn by a background thread while the learner trains (`prefetch`), and the importance
exponent beta of prioritized replay anneals linearly to 1 over the run (Schaul et al., 2016).
The replay memory is checkpointed only on request (`checkpoint_replay`: at 1M transitions it is
8.3 GB); otherwise a resumed run refills it (`min_replay_steps`) before learning again.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import os
import re
import time
import zipfile

import gin
import numpy as np
import tensorflow as tf

from tfaccel import checkpoint, console, learner, networks, runner
from tfaccel.algorithms import dqn
from tfaccel.distribute import strategies
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.pool import PoolError
from tfaccel.logger import Progress
from tfaccel.prefetch import Prefetcher
from tfaccel.replay import (
    ReplayBatch,
    ReplayBuffer,
    available_memory,
    memory_needed,
)
from tfaccel.sampler import ReplaySampler


def _compile_act(network, spec, batch_size: int, atoms, seed: int):
    generator = tf.random.Generator.from_seed(seed)
    signature = [
        tf.TensorSpec((batch_size, *spec.observation.shape), tf.uint8),
        tf.TensorSpec((), tf.float32),
    ]

    @tf.function(input_signature=signature, autograph=False)
    def act(observation, epsilon):
        return dqn.act(network, observation, epsilon, generator, atoms)

    return (lambda observation, epsilon: act(observation, np.float32(epsilon)).numpy()), generator


def _sample(replays, batch_size: int, beta: float) -> tuple[ReplayBatch, list[int]]:
    """An equal share of the batch from each group's buffer, concatenated.

    Prioritized: a transition of group g is drawn with probability P_g(i) / G per draw, so its
    importance weight is (N * P_g(i) / G)^-beta (N: the valid transitions of all groups),
    normalized by the largest of the whole batch, as one buffer of all groups would weigh it.
    """
    share = batch_size // len(replays)
    sizes = [len(replay) for replay in replays]
    parts = [replay.sample(share, beta, normalize=False) for replay in replays]
    batch = ReplayBatch(*(np.concatenate(fields) for fields in zip(*parts, strict=True)))
    if replays[0].prioritized:  # the parts' weights are (N_g * P_g(i))^-beta
        scale = [(sum(sizes) / (len(replays) * size)) ** -beta for size in sizes]
        weight = batch.weight * np.repeat(np.asarray(scale, np.float32), share)
        batch = batch._replace(weight=(weight / weight.max()).astype(np.float32))
    return batch, [share] * len(replays)


@gin.configurable(denylist=["root_dir"])
def train_off_policy(
    root_dir: str,
    env=gin.REQUIRED,
    algorithm=gin.REQUIRED,
    torso=networks.nature_torso,
    dueling: bool = False,
    make_optimizer=learner.make_adam,
    learning_rate: float = 6.25e-5,
    num_workers: int = 2,
    envs_per_worker: int = 8,
    num_groups: int = 2,
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
    total_frames: int = 10_000_000,
    log_interval_frames: int = 100_000,
    checkpoint_interval_frames: int = 1_000_000,
    eval_episodes: int = 0,
    worker_niceness: int = 5,
    tf_threads: int = 0,
    max_wall_seconds: float = 0.0,
    prefetch: bool = True,
    assembly_threads: int = 2,
    checkpoint_replay: bool = False,
    seed: int = 0,
    on_nonfinite: str = "skip",
) -> dict:
    """Trains a DQN-family agent from replay; see the module docstring.

    Args:
        root_dir: the run directory (created; reused to resume).
        env: env factory, e.g. `@AtariConfig()`.
        algorithm: `@DQNConfig()`: loss options, epsilon schedule, target period.
        torso: network torso factory (`@nature_torso`, `@a3c_torso`).
        dueling: dueling heads (Wang et al., 2016).
        make_optimizer: `learning_rate -> optimizer`.
        learning_rate: the optimizer's learning rate (constant).
        num_workers: env worker processes (0: the envs step in this process, see `make_pool`).
        envs_per_worker: envs per worker.
        num_groups: 1 or 2 alternating groups, one replay buffer each.
        replay_capacity: transitions kept, over all envs.
        n_step: steps of the n-step return.
        discount: gamma.
        prioritized: prioritized replay (Schaul et al., 2016).
        priority_alpha: priority exponent alpha.
        priority_beta: importance-sampling exponent beta at the start.
        anneal_beta: beta grows linearly to 1 over `total_frames` (else it stays constant).
        batch_size: samples per gradient step.
        replay_ratio: gradient samples per agent step (training intensity).
        min_replay_steps: agent steps stored before learning starts.
        total_frames: env frames to train for (frames = agent steps x frame skip).
        log_interval_frames: env frames between rows of metrics.csv.
        checkpoint_interval_frames: env frames between checkpoints (each also exports the policy).
        eval_episodes: full games played by the exported policy at each checkpoint, with
            `algorithm.eval_epsilon` (Atari only; raw score, written to eval.csv); 0: none.
        worker_niceness: nice value added to env workers.
        tf_threads: TensorFlow threads in this process (0: one per core).
        max_wall_seconds: also stop (and save) after this much wall time (0: no limit).
        prefetch: draw batches in a background thread while the learner trains (False: draw
            each batch when it is needed; the run is then a function of the seed on a
            deterministic env).
        assembly_threads: threads that rebuild a batch's stacked observations from the replay's
            frames (`ReplayBuffer`; batches of 64 and more): a batch of 512 takes 3.4 ms with 2
            threads against 6.3 ms with 1 on 2 cores (benchmarks/replay_memory.py).
        checkpoint_replay: save the replay memory with each checkpoint and restore it on resume
            (a resumed run then learns on at once instead of refilling); one file, the latest.
        seed: seeds the initial weights, the envs, replay sampling and exploration.
        on_nonfinite: after a step with a non-finite loss or gradient (never applied; its
            batch's priorities are kept): `skip`, `restore` or `stop` (`runner.NonFiniteGuard`).
    """
    runner.NonFiniteGuard.check_action(on_nonfinite)  # before anything starts
    strategy = console.set_up_tensorflow(tf_threads, strategies.make_strategy)
    precision = networks.set_precision()  # gin: set_precision.policy
    strategies.check_split(strategy, batch_size, "train_off_policy.batch_size")
    # Several machines: as in `runner.train`, each worker acts and replays on its own envs.
    team = strategies.SyncTeam(strategy)
    chief, vote, seed = team.chief, team.stop, team.seed(seed)
    run_dir, log, eval_log = runner.open_run(root_dir, team, precision)
    frame_skip = getattr(env, "frame_skip", 1)
    atoms = dqn.support(algorithm) if algorithm.num_atoms > 1 else None
    with runner.make_pool(
        env, num_workers, envs_per_worker, num_groups, seed, worker_niceness
    ) as pool:
        observation = pool.spec.observation
        if len(observation.shape) != 3 or observation.dtype != np.uint8:
            raise ValueError(
                "the replay stores uint8 frames [H, W, stack], one frame per step; this env "
                f"observes {observation.dtype} {list(observation.shape)}: train it on-policy "
                "(a2c.gin, ppo.gin)"
            )
        height, width, stack = observation.shape
        needed = num_groups * memory_needed(
            pool.group_size, replay_capacity // num_groups, (height, width)
        )
        available = available_memory()
        if available is not None and needed > available:
            raise ValueError(
                f"a replay of {replay_capacity:,} transitions of {height}x{width} frames needs "
                f"{needed / 2**30:.1f} GiB, and this machine has {available / 2**30:.1f} GiB "
                "available: lower train_off_policy.replay_capacity"
            )
        replays = [
            ReplayBuffer(
                pool.group_size,
                replay_capacity // num_groups,
                (height, width),
                stack=stack,
                n_step=n_step,
                discount=discount,
                prioritized=prioritized,
                alpha=priority_alpha,
                seed=seed + g,
                assembly_threads=assembly_threads,
            )  # fmt: skip
            for g in range(num_groups)
        ]
        if batch_size % num_groups:
            raise ValueError(
                f"train_off_policy.batch_size = {batch_size} does not split into {num_groups} "
                "equal shares (one from each group's replay): use a multiple of num_groups"
            )
        # A full ring still has its newest n steps and its oldest stack - 1 incomplete.
        reachable = sum((r.time - n_step - stack) * r.num_envs for r in replays)
        if min_replay_steps > reachable:
            raise ValueError(
                f"train_off_policy.min_replay_steps = {min_replay_steps:,} is never reached: a "
                f"replay of {replay_capacity:,} transitions on {pool.num_envs} envs holds at "
                f"most {reachable:,} complete ones; lower min_replay_steps or raise "
                "replay_capacity"
            )

        def make_network():
            return networks.QNetwork(
                pool.spec, torso=torso, dueling=dueling, num_atoms=algorithm.num_atoms
            )

        def loss_fn(network, batch):
            return dqn.loss(network, agent.target, batch, algorithm)

        agent = learner.Learner(
            make_network, loss_fn, lambda: make_optimizer(float(learning_rate)),
            max_grad_norm=algorithm.max_grad_norm, target_network=True, seed=seed,
            strategy=strategy,
        )  # fmt: skip
        act, generator = _compile_act(agent.network, pool.spec, pool.group_size, atoms, seed)
        counters = checkpoint.Counters()
        saver = checkpoint.Checkpointer(
            os.path.join(run_dir, "checkpoints"), network=agent.network, target=agent.target,
            optimizer=agent.optimizer, counters=counters, generator=generator,
        )  # fmt: skip
        restored = runner.resume(saver, run_dir, (log, eval_log), counters, frame_skip, team)
        runner.set_frame_offsets([agent.network, agent.target], env, seed, log)
        checkpoint_dir = os.path.join(run_dir, "checkpoints")
        if restored and checkpoint_replay:
            loaded = _restore_replays(checkpoint_dir, restored, replays)
            log.message("replay restored" if loaded else "no replay saved with it: refilling")
        if atoms is None:
            head = dict(head="q_values", head_fn=lambda output: ("q_values", output))
        else:
            probabilities = lambda output: ("probabilities", tf.nn.softmax(output, -1))  # noqa: E731
            head = dict(head="probabilities", head_fn=probabilities, support=atoms.numpy())
        atari = env if isinstance(env, AtariConfig) else None

        def save(state) -> None:
            counters.agent_steps.assign(state.frames // frame_skip)
            counters.wall_seconds.assign(state.base_wall + state.elapsed())
            counters.remember_scores(state.recent)
            # The replay first: a save cut midway resumes from the checkpoint before, with its
            # replay. A replay that cannot be written (a full disk) still lets the checkpoint be.
            saved = checkpoint_replay and _save_replays(checkpoint_dir, state.frames, replays, log)
            saver.save(state.frames)
            if saved:
                _prune_replays(checkpoint_dir, state.frames)
            state.last_save = state.frames
            if chief:
                runner.publish_policy(
                    agent.network, atari, root_dir, (log, eval_log), state.frames, frame_skip,
                    state.base_wall + state.elapsed(), eval_episodes, algorithm.eval_epsilon,
                    seed, **head,
                )  # fmt: skip

        sampler = ReplaySampler(pool, act, replays)
        state = _LoopState(counters, frame_skip, algorithm.target_update_period)
        state.beta = priority_beta
        guard = runner.NonFiniteGuard(on_nonfinite, agent, saver, log, team)
        watch = runner.DeadNetworkWatch(log)
        warm = False  # every worker has min_replay_steps transitions (they start together)

        def draw() -> tuple[np.ndarray, list[int], ReplayBatch]:
            batch, shares = _sample(replays, batch_size, state.beta)
            return batch.index, shares, agent.prepare(batch)

        prefetcher = None
        state.display = Progress(log, total_frames, frame_skip, state.frames)
        log.message(
            f"filling the replay: learning starts when each process holds {min_replay_steps:,} "
            f"transitions ({pool.num_envs} envs here; {total_frames - state.frames:,} frames to go)"
        )
        keep_progress = runner.saved_on(PoolError, lambda: save(state))
        with runner.StopRequest() as stop, contextlib.ExitStack() as cleanup, keep_progress:
            while True:
                out_of_time = max_wall_seconds and state.elapsed() >= max_wall_seconds
                if vote(
                    state.frames >= total_frames or stop.signal_name is not None or out_of_time
                ):
                    break
                steps = team.agent_steps(state.base_steps, sampler.agent_steps)
                sampler.step(dqn.epsilon(algorithm, steps))
                stored = sum(len(r) for r in replays)
                warm = warm or not vote(stored < min_replay_steps)
                if warm:
                    state.due += pool.num_envs * replay_ratio / batch_size
                if anneal_beta:
                    progress = min(state.frames / total_frames, 1.0)
                    state.beta = priority_beta + (1.0 - priority_beta) * progress
                if prefetch and prefetcher is None and state.due >= 1.0:
                    prefetcher = cleanup.enter_context(Prefetcher(draw))
                next_batch = prefetcher.get if prefetcher else draw
                tick = time.perf_counter()
                while state.due >= 1.0:
                    state.metrics = _train_once(agent, replays, next_batch, prioritized, state)
                    guard.check(state.metrics, state.frames)
                    watch.check(state.metrics, state.frames)
                    state.due -= 1.0
                state.learn_seconds += time.perf_counter() - tick
                steps = team.agent_steps(state.base_steps, sampler.agent_steps)
                if steps // algorithm.target_update_period > state.synced:
                    agent.sync_target()
                    state.synced = steps // algorithm.target_update_period
                runner.report_faults(pool, log)
                games = sampler.drain_games()
                state.recent.extend(score for score, _ in games)
                counters.games.assign_add(len(games))
                state.frames = steps * frame_skip
                if state.frames - state.last_log >= log_interval_frames:
                    _log(log, state, sampler, stored, dqn.epsilon(algorithm, steps), total_frames)
                elif state.display.due():
                    _show(state, sampler, stored)
                if state.frames - state.last_save >= checkpoint_interval_frames:
                    save(state)
        if state.frames > state.last_log:
            final_epsilon = dqn.epsilon(algorithm, state.frames // frame_skip)
            _log(log, state, sampler, sum(len(r) for r in replays), final_epsilon, total_frames)
        if state.frames > state.last_save:  # not saved already at this count
            save(state)
        log.end_progress()
        if stop.signal_name:
            log.message(
                f"stopped by {stop.signal_name} at {state.frames:,} frames; checkpoint saved: "
                "run the same command to resume"
            )
    return {
        "env_frames": state.frames,
        "final_score": float(np.mean(state.recent)) if state.recent else float("nan"),
        "wall_s": state.base_wall + state.elapsed(),
        "stopped_by": stop.signal_name,
    }


class _LoopState:
    """Counters of the loop that survive in the checkpoint or only in this process."""

    def __init__(self, counters, frame_skip: int, target_update_period: int):
        self.counters, self.frame_skip = counters, frame_skip
        self.base_steps, self.base_wall = int(counters.agent_steps), float(counters.wall_seconds)
        self.frames = self.last_log = self.last_save = self.base_steps * frame_skip
        self.recent = collections.deque(counters.recalled_scores(), maxlen=counters.RECENT)
        self.start = self.last_time = time.perf_counter()
        self.learn_seconds = 0.0  # in train steps, including the wait for their batches
        self.wait_seconds = 0.0  # waiting for batches
        self.due = 0.0  # train steps owed to the replay ratio
        # Target syncs happen as the agent steps cross multiples of the period, so a resumed run
        # keeps the target network of its checkpoint and syncs where the unbroken run would.
        self.synced = self.base_steps // target_update_period  # periods synced so far
        self.metrics: dict = {}
        self.beta = 1.0
        self.display = None  # the progress line (`logger.Progress`), set when the loop starts

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def _train_once(agent, replays, next_batch, prioritized: bool, state) -> dict:
    """One gradient step on the next batch (drawn equally from every group's buffer); updates
    the priorities of its transitions."""
    tick = time.perf_counter()
    index, shares, batch = next_batch()  # batch: as the learner takes it (Learner.prepare)
    state.wait_seconds += time.perf_counter() - tick
    metrics = agent.train(batch)
    priority = metrics.pop("priority")
    if prioritized and not metrics["skipped_updates"]:  # a skipped step's priorities may be NaN
        cuts = np.cumsum(shares)[:-1]
        for replay, part, value in zip(
            replays, np.split(index, cuts), np.split(priority, cuts), strict=True
        ):
            replay.update_priorities(part, value)
    return metrics


def _replay_path(directory: str, frames: int) -> str:
    return os.path.join(directory, f"replay-{frames}.npz")


def _save_replays(directory: str, frames: int, replays, log) -> bool:
    """Writes every group's replay state to `replay-{frames}.npz`, atomically; True if it did.

    A write that fails (a full disk, say) leaves no partial file and does not stop the run: the
    checkpoint is still saved, and a resume from it refills the replay.
    """
    os.makedirs(directory, exist_ok=True)
    arrays = {
        f"group{g}/{name}": value
        for g, replay in enumerate(replays)
        for name, value in replay.state_dict().items()
    }
    temporary = _replay_path(directory, frames) + ".partial.npz"
    try:
        np.savez(temporary, **arrays)
        os.replace(temporary, _replay_path(directory, frames))
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        log.message(
            f"warning: the replay memory was not saved with ckpt-{frames} ({error}); a resume "
            "from that checkpoint refills the replay"
        )
        return False
    return True


def _prune_replays(directory: str, frames: int) -> None:
    """Removes replay files of older checkpoints, and parts of cut saves (the memory is large:
    one file is kept)."""
    keep = _replay_path(directory, frames)
    for path in glob.glob(os.path.join(directory, "replay-*.npz")):
        if path != keep:
            os.remove(path)


def _restore_replays(directory: str, checkpoint_path: str, replays) -> bool:
    """Loads the replay saved with `checkpoint_path` (`.../ckpt-N`); False if there is none.

    Raises:
        ValueError: the file is unreadable or does not fit these buffers.
    """
    match = re.search(r"ckpt-(\d+)$", checkpoint_path)
    path = match and _replay_path(directory, int(match.group(1)))
    if not path or not os.path.exists(path):
        return False
    try:
        with np.load(path, allow_pickle=False) as archive:  # never unpickle a file
            for g, replay in enumerate(replays):
                prefix = f"group{g}/"
                state = {
                    k[len(prefix) :]: archive[k]
                    for k in archive.files
                    if k.startswith(prefix) and k != prefix + "frames"
                }
                with _StoredRows(archive.zip, prefix + "frames.npy") as frames:
                    replay.load_state_dict(dict(state, frames=frames))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"cannot restore the replay memory from {path} ({error}); delete the file to refill "
            "the replay instead, or set train_off_policy.checkpoint_replay = False"
        ) from error
    return True


class _StoredRows:
    """An array of an `.npz` file (as `np.savez` writes them: stored, not compressed) read block
    by block as its row slices are asked for, in order, so only one block is in memory."""

    def __init__(self, archive: zipfile.ZipFile, member: str):
        self._stream = archive.open(member)
        version = np.lib.format.read_magic(self._stream)
        if version == (1, 0):
            self.shape, fortran, self.dtype = np.lib.format.read_array_header_1_0(self._stream)
        else:
            self.shape, fortran, self.dtype = np.lib.format.read_array_header_2_0(self._stream)
        if fortran or self.dtype.hasobject:
            raise ValueError(f"{member}: not an array of plain values in C order")
        self._next = 0

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.shape[0])
        if start != self._next or step != 1:
            raise ValueError(f"rows {start}:{stop} asked for, but the next ones are {self._next}:")
        block = np.empty((stop - start, *self.shape[1:]), self.dtype)
        view, done = memoryview(block).cast("B"), 0
        while done < block.nbytes:
            count = self._stream.readinto(view[done:])
            if not count:
                raise EOFError(f"the file ends before row {stop} of {self.shape[0]}")
            done += count
        self._next = stop
        return block

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._stream.close()


def _log(log, state, sampler, stored: int, epsilon: float, total_frames: int) -> None:
    now, elapsed = time.perf_counter(), state.elapsed()
    steps = state.frames // state.frame_skip
    fps = (state.frames - state.last_log) / max(now - state.last_time, 1e-9)  # every worker's
    score = float(np.mean(state.recent)) if state.recent else float("nan")
    row = {
        "env_frames": state.frames,
        "agent_steps": steps,
        "wall_s": state.base_wall + elapsed,
        "fps": fps,
        "episode_return_raw_mean": score,
        "episodes": int(state.counters.games),
        "epsilon": epsilon,
        "replay_size": stored,
        "env_fraction": sampler.seconds["env"] / elapsed,
        "inference_fraction": sampler.seconds["inference"] / elapsed,
        "learn_fraction": state.learn_seconds / elapsed,
        "worker_restarts": sampler.pool.restarts,
        "peak_rss_mib": runner.peak_rss_mib(),
        "replay_wait_fraction": state.wait_seconds / max(state.learn_seconds, 1e-9),
        "priority_beta": state.beta,
        **state.metrics,
    }
    log.write(row)
    _show(state, sampler, stored)
    state.last_log, state.last_time = state.frames, now


def _show(state, sampler, stored: int) -> None:
    elapsed = max(state.elapsed(), 1e-9)
    split = (sampler.seconds["env"], sampler.seconds["inference"], state.learn_seconds)
    score = float(np.mean(state.recent)) if state.recent else float("nan")
    split = tuple(part / elapsed for part in split)
    state.display.show(state.frames, score, split, f"  replay {stored:,}")
