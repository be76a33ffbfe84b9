"""Replay memory of the DQN family: per-env ring buffers, frame de-duplication, n-step, priorities.

Organized by simulator as in Stooke & Abbeel (2018), section 4: B envs write one step each per
`add`, into a [T, B] ring (T = capacity // B). Each frame is stored once: a step keeps only the
newest frame of its observation, and `stack`-frame observations are rebuilt at sample time from the
ring, with zeros before an episode's first frame, exactly as `tfaccel.envs.frames.FrameStack` builds
them. The last frame of a truncated episode (needed for its bootstrap) goes to a small side ring.

Indices: the transition of env b at global step u is `index = u * B + b` (its ring slot is
u % T): an index names one transition for good, and one whose slot was written again is no
longer held (`get` refuses it, `update_priorities` skips it).

A transition u has the n-step target `R = sum_{k<n'} discount^k r_{u+k}` up to the first episode
end within n steps (n' <= n), the bootstrap discount `discount^n' * (1 - terminated)`, and the
bootstrap observation: the observation at u + n (no end), the episode's final observation (a
truncation at u + n' - 1), or, after a termination at e = u + n' - 1, the observation acted on at e
(a placeholder: its discount is 0). It is valid (sampleable) when its window is complete, every
frame it needs is still in the ring, and a truncation's final frame is still in the side ring.

Streams: the first `add` after construction or `load_state_dict` starts a new stream. Its
observation counts as an episode start if its older frames are all zero; otherwise the first
`stack - 1` steps (whose history is missing) are not sampleable. The last step of the previous
stream is cut: transitions whose n-step window reaches it are never sampleable.

Threads: every public method of `ReplayBuffer` holds the buffer's lock, so a
`tfaccel.prefetch.Prefetcher` thread may sample while the sampler adds steps and the learner updates priorities.

Numpy only.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from typing import NamedTuple

import numpy as np

_NONE, _TERMINATED, _TRUNCATED, _CUT = 0, 1, 2, 3  # how a step ended (uint8 codes)
_STACK_CHECK_STEPS = 32  # the first steps of a stream whose stacks are checked (`add`)
_ROWS_PER_THREAD = 64  # smaller batches are assembled by the calling thread alone


@functools.cache
def _assembly_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The threads that assemble stacks (shared by all buffers; idle threads cost nothing)."""
    return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tfaccel-replay")


class SumTree:
    """Sums of non-negative priorities over `capacity` leaves, in one numpy array.

    Node i has children 2i and 2i + 1; the root is node 1; leaf j is node `size + j`, where
    `size` is the smallest power of two >= capacity. `sample` maps each value in [0, total) to the
    leaf whose prefix-sum interval contains it.

    Example:
        >>> tree = SumTree(4)
        >>> tree.update(np.array([0, 1, 2, 3, 3]), np.array([1.0, 2.0, 3.0, 9.0, 4.0]))
        >>> tree.total()  # the last write to leaf 3 wins: 1 + 2 + 3 + 4
        10.0
        >>> tree.sample(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 6.0, 9.99])).tolist()
        [0, 0, 1, 1, 2, 3, 3]

    (leaf intervals: 0 -> [0, 1), 1 -> [1, 3), 2 -> [3, 6), 3 -> [6, 10)).
    """

    def __init__(self, capacity: int):
        """Args:
        capacity: number of leaves.
        """
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.nodes = np.zeros(2 * self.size, np.float64)  # [2 * size], node 0 unused

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Sets leaves `indices` [K] to `priorities` [K]; where an index repeats, the last wins."""
        indices = np.asarray(indices, np.int64).ravel()
        priorities = np.broadcast_to(np.asarray(priorities, np.float64), indices.shape)
        if indices.size == 0:
            return
        _, last = np.unique(indices[::-1], return_index=True)  # first in reverse = last write
        keep = indices.size - 1 - last
        nodes = indices[keep] + self.size
        self.nodes[nodes] = priorities[keep]
        for _ in range(self.depth):
            nodes = np.unique(nodes // 2)
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]

    def total(self) -> float:
        """The sum of all priorities (the root)."""
        return float(self.nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Priorities [K] of leaves `indices` [K]."""
        return self.nodes[np.asarray(indices, np.int64) + self.size]

    def sample(self, uniform_values: np.ndarray) -> np.ndarray:
        """Leaf indices [K] (int64) whose prefix-sum intervals contain `uniform_values` [K]."""
        values = np.array(uniform_values, np.float64)  # [K], a copy: consumed by the descent
        nodes = np.ones(values.shape, np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            left_sum = self.nodes[left]
            right = values >= left_sum
            values -= np.where(right, left_sum, 0.0)
            nodes = left + right
        return np.minimum(nodes - self.size, self.capacity - 1)


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class ReplayBatch(NamedTuple):
    """N sampled transitions (time flattened), with their n-step targets."""

    observation: np.ndarray  # [N, H, W, stack] uint8, o_tm1
    action: np.ndarray  # [N] int32, a_tm1
    reward: np.ndarray  # [N] float32, the n-step return
    discount: np.ndarray  # [N] float32, discount^n' * (1 - terminated)
    next_observation: np.ndarray  # [N, H, W, stack] uint8, the bootstrap observation
    weight: np.ndarray  # [N] float32, importance weights (ones when uniform)
    index: np.ndarray  # [N] int64, step * B + env: for `update_priorities` (see `indices`)


def final_capacity(num_envs: int, capacity: int, truncation_capacity: int | None = None) -> int:
    """Entries of the side ring of final frames (see `ReplayBuffer`'s `truncation_capacity`)."""
    return int(truncation_capacity or 4 * num_envs + capacity // 256)


def memory_needed(num_envs: int, capacity: int, frame_shape, truncation_capacity=None) -> int:
    """Bytes a `ReplayBuffer` of these sizes holds once full: one frame per transition plus its
    action, reward and flags (27 bytes), the side ring of final frames, and the sum tree."""
    time_steps = int(capacity) // int(num_envs)
    pixels = int(np.prod(frame_shape))
    transitions = time_steps * int(num_envs)
    tree = 16 * (1 << max(0, (transitions - 1).bit_length()))
    finals = final_capacity(num_envs, capacity, truncation_capacity) * (pixels + 8)
    return transitions * (pixels + 27) + finals + tree


def available_memory() -> int | None:
    """Bytes of memory the kernel can give without swapping (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class ReplayBuffer:
    """Per-env ring buffers of single frames, with n-step targets and optional priorities."""

    def __init__(
        self,
        num_envs: int,
        capacity: int,
        frame_shape: tuple[int, int],
        stack: int = 4,
        n_step: int = 1,
        discount: float = 0.99,
        prioritized: bool = False,
        alpha: float = 0.5,
        epsilon: float = 1e-6,
        seed: int = 0,
        truncation_capacity: int | None = None,
        assembly_threads: int = 1,
    ):
        """Args:
        num_envs: B, the envs that write one step each per `add`.
        capacity: total size in transitions; each env keeps the last T = capacity // B steps.
        frame_shape: (H, W) of one frame.
        stack: frames per observation (the env's frame stack, last axis, oldest first).
        n_step: n, the steps summed into the return before bootstrapping.
        discount: gamma, the per-step discount.
        prioritized: sample in proportion to priority^alpha (Schaul et al., 2016) instead of
            uniformly; new transitions get the largest priority seen so far.
        alpha: priority exponent (0: uniform).
        epsilon: floor of a priority, so every transition keeps a chance to be drawn.
        seed: seed of the sampling generator.
        truncation_capacity: final frames of truncated episodes kept in the side ring (default
            4 * B + capacity // 256); a truncated transition whose final frame was overwritten is
            no longer sampleable.
        assembly_threads: threads that rebuild the stacks of a batch (batches of 64 rows and
            more; one is the calling thread alone).
        """
        self.num_envs, self.stack, self.n_step = int(num_envs), int(stack), int(n_step)
        self.frame_shape = tuple(int(s) for s in frame_shape)
        self.time = int(capacity) // self.num_envs  # T
        if self.time <= self.n_step + self.stack:
            raise ValueError(f"capacity {capacity} is too small: need > (n_step + stack) * B")
        self.discount, self.prioritized = float(discount), bool(prioritized)
        self.alpha, self.epsilon = float(alpha), float(epsilon)
        if int(assembly_threads) < 1:
            raise ValueError(f"assembly_threads must be at least 1, got {assembly_threads}")
        self.assembly_threads = int(assembly_threads)
        self.final_capacity = final_capacity(num_envs, capacity, truncation_capacity)  # F
        T, B, F = self.time, self.num_envs, self.final_capacity
        self._rng = np.random.default_rng(seed)
        self._frames = np.zeros((T, B, *self.frame_shape), np.uint8)  # newest frame of o_u
        self._action = np.zeros((T, B), np.int32)
        self._reward = np.zeros((T, B), np.float32)
        self._end = np.zeros((T, B), np.uint8)  # _NONE, _TERMINATED, _TRUNCATED or _CUT
        self._start = np.zeros((T, B), np.int64)  # step of the episode's first frame
        self._stack_ok = np.zeros((T, B), bool)  # o_u's frames were all stored in its stream
        self._final_id = np.full((T, B), -1, np.int64)  # side-ring id, where truncated
        self._final_frames = np.zeros((F, *self.frame_shape), np.uint8)
        self._final_step = np.zeros(F, np.int64)  # step of the truncation that wrote each entry
        self._valid = np.zeros((T, B), bool)
        self._tree = SumTree(T * B)
        self._count = 0  # steps added (the next step's index)
        self._finals = 0  # final frames written
        self._num_valid = 0
        self._max_priority = 1.0  # largest priority^alpha so far
        self._stream_start = 0
        self._previous = None  # the last observation added, while stacks are checked
        self._stacks_checked = self._stacks_wrong = 0  # env steps checked, and those that failed
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._num_valid

    @_locked
    def add(self, observation, action, reward, terminated, truncated, final_observation) -> None:
        """Stores one step of every env.

        Args:
            observation: [B, H, W, stack] uint8, the observation the action was taken on.
            action: [B], the action taken.
            reward: [B], the step's reward (from the `PoolStep` it produced).
            terminated: [B] bool, the step ended the episode without a bootstrap.
            truncated: [B] bool, the step ended the episode with a bootstrap.
            final_observation: [B, H, W, stack], the ended episode's last observation (read where
                truncated).
        """
        observation = np.asarray(observation)
        expected = (self.num_envs, *self.frame_shape, self.stack)
        if observation.shape != expected:
            raise ValueError(f"observation shape {observation.shape}, expected {expected}")
        t, T, S = self._count, self.time, self.stack
        if S > 1 and t - self._stream_start < _STACK_CHECK_STEPS:
            self._check_stack(observation, t)
        slot, terminated = t % T, np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        if t == self._stream_start:
            if t > 0:  # cut the previous stream
                prev = self._end[(t - 1) % T]
                prev[prev == _NONE] = _CUT
            fresh = ~observation[..., :-1].any(axis=(1, 2, 3))  # [B] older frames all zero
            start = np.where(fresh, t, t - S)  # unknown history: the first S - 1 stacks miss it
        else:
            prev = (t - 1) % T
            start = np.where(self._end[prev] != _NONE, t, self._start[prev])  # [B]
        self._invalidate(slot)  # step t - T leaves; step t must not inherit its priority
        self._frames[slot] = observation[..., -1]
        self._action[slot] = action
        self._reward[slot] = reward
        self._end[slot] = np.where(terminated, _TERMINATED, np.where(truncated, _TRUNCATED, _NONE))
        self._start[slot] = start
        self._stack_ok[slot] = np.maximum(start, t - S + 1) >= self._stream_start
        self._final_id[slot] = -1
        refresh = [t - np.arange(self.n_step + 1), t + 1 + np.arange(S - 1)]
        ids = self._finals + np.arange(int(truncated.sum()))  # [K]
        if ids.size:
            lost = ids[ids >= self.final_capacity] % self.final_capacity
            for k in range(self.n_step):  # windows that reached an overwritten final frame
                refresh.append(self._final_step[lost] - k)
            final = np.asarray(final_observation)[truncated][..., -1]  # [K, H, W]
            self._final_frames[ids % self.final_capacity] = final
            self._final_step[ids % self.final_capacity] = t
            self._final_id[slot, truncated] = ids
            self._finals += ids.size
        self._count = t + 1
        self._refresh(np.unique(np.concatenate(refresh) % T))

    def _check_stack(self, observation: np.ndarray, t: int) -> None:
        """Checks, over the first steps of a stream, that the envs' observations are their
        previous ones moved on by a frame (the replay keeps only the newest frame of each and
        rebuilds the rest from them). Most steps of a stack env pass; an env whose channels are
        of other kinds fails nearly all (a replaced env's first step, say, fails alone).

        Raises:
            ValueError: most observations checked are not such stacks of frames.
        """
        previous, self._previous = self._previous, observation.copy()
        if t == self._stream_start:  # a stream's first step: nothing before it to compare
            self._stacks_checked = self._stacks_wrong = 0
            return
        went_on = self._end[(t - 1) % self.time] == _NONE  # [B] not a new episode's first step
        moved = (observation[..., :-1] == previous[..., 1:]).all(axis=(1, 2, 3))  # [B]
        self._stacks_checked += int(went_on.sum())
        self._stacks_wrong += int((went_on & ~moved).sum())
        last = t - self._stream_start == _STACK_CHECK_STEPS - 1
        if last and self._stacks_wrong * 2 > self._stacks_checked:
            raise ValueError(
                f"the observations are not stacks of frames: in {self._stacks_wrong} of "
                f"{self._stacks_checked} steps the older {self.stack - 1} channels were not the "
                "previous observation's newer ones. The DQN family's replay keeps only the "
                "newest frame of each observation and rebuilds the rest, so the last axis must "
                "be a stack of frames, newest last (tfaccel.envs.frames.FrameStack); an "
                "observation of one frame ([H, W, 1]), or the policy-gradient trainers, take "
                "channels of other kinds"
            )

    def _steps(self, slots: np.ndarray) -> np.ndarray:
        """The global step [K] now held by ring slots [K]."""
        latest = self._count - 1
        return latest - (latest - slots) % self.time

    def _invalidate(self, slot: int) -> None:
        self._num_valid -= int(self._valid[slot].sum())
        self._valid[slot] = False
        if self.prioritized:
            self._tree.update(slot * self.num_envs + np.arange(self.num_envs), 0.0)

    def _refresh(self, slots: np.ndarray) -> None:
        """Recomputes validity of the transitions at `slots` [K] (all envs) after an `add`."""
        B = self.num_envs
        steps = np.repeat(self._steps(slots), B)  # [K * B]
        envs = np.tile(np.arange(B), slots.size)  # [K * B]
        valid = self._window(steps, envs)[0].reshape(slots.size, B)  # [K, B]
        old = self._valid[slots]  # [K, B]
        self._valid[slots] = valid
        self._num_valid += int(valid.sum()) - int(old.sum())
        if self.prioritized:
            flat = slots[:, None] * B + np.arange(B)  # [K, B]
            self._tree.update(flat[valid & ~old], self._max_priority)
            self._tree.update(flat[old & ~valid], 0.0)

    def _window(self, step: np.ndarray, env: np.ndarray):
        """The n-step window of transitions (step [N], env [N]).

        Returns:
            valid [N] bool, return [N] float64, discount [N] float64, bootstrap step [N] int64
            (the observation's step; for a truncation, the step after it), truncated [N] bool
            and final_id [N] int64 (where truncated, the side-ring id of the bootstrap's newest
            frame).
        """
        T, latest, n = self.time, self._count - 1, self.n_step
        slot = step % T
        valid = (step >= 0) & (step > latest - T) & self._stack_ok[slot, env]
        valid &= np.maximum(self._start[slot, env], step - self.stack + 1) > latest - T
        ret, disc = np.zeros(step.shape), np.full(step.shape, self.discount**n)
        boot, final_id = step + n, np.full(step.shape, -1, np.int64)
        alive, trunc = np.ones(step.shape, bool), np.zeros(step.shape, bool)
        for k in range(n):
            known = step + k <= latest
            valid &= ~(alive & ~known)  # window not complete yet
            s = (step + k) % T
            code = np.where(known, self._end[s, env], _NONE)
            ret += np.where(alive & known, self.discount**k * self._reward[s, env], 0.0)
            ended = alive & (code != _NONE)
            valid &= ~(ended & (code == _CUT))
            here = ended & (code == _TRUNCATED)
            fid = self._final_id[s, env]
            valid &= ~(here & (fid < self._finals - self.final_capacity))
            disc = np.where(ended, self.discount ** (k + 1) * (code == _TRUNCATED), disc)
            boot = np.where(ended, step + k + here, boot)
            final_id = np.where(here, fid, final_id)
            trunc |= here
            alive &= ~ended
        valid &= ~(alive & (step + n > latest))
        return valid, ret, disc, boot, trunc, final_id

    def _observations(self, step, env, start, newest=None, out=None) -> np.ndarray:
        """Stacks [N, H, W, stack] ending at `step` [N], zeros before `start` [N], written into
        `out` when given (a slice of a larger batch: no copy afterwards).

        `newest` = (use [N] bool, frames [K, H, W]) replaces the newest frame of the K rows in
        `use`. The rows are split among `assembly_threads` threads: numpy's gathers and copies
        release the GIL.
        """
        shape = (step.size, *self.frame_shape, self.stack)
        if out is not None and (out.shape != shape or out.dtype != np.uint8):
            raise ValueError(f"out is {out.dtype} {out.shape}; the stacks are uint8 {shape}")
        stacks = np.empty(shape, np.uint8) if out is None else out
        steps = step[:, None] - np.arange(self.stack - 1, -1, -1)  # [N, stack], oldest first
        if newest is not None:
            use, frames = newest
            first_frame = np.concatenate([[0], np.cumsum(use)])  # [N + 1] row -> row of frames

        def fill(rows: slice) -> None:
            for k in range(self.stack):  # plane by plane: 2.5x faster than gather + moveaxis
                plane = self._frames[steps[rows, k] % self.time, env[rows]]  # [n, H, W]
                plane[steps[rows, k] < start[rows]] = 0
                if newest is not None and k == self.stack - 1:
                    plane[use[rows]] = frames[first_frame[rows.start] : first_frame[rows.stop]]
                stacks[rows, ..., k] = plane

        threads = min(self.assembly_threads, max(step.size // _ROWS_PER_THREAD, 1))
        bounds = np.linspace(0, step.size, threads + 1).astype(int)
        chunks = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        if threads == 1:
            fill(chunks[0])
        else:
            for done in [_assembly_pool(threads).submit(fill, rows) for rows in chunks]:
                done.result()
        return stacks  # [N, H, W, stack]

    @_locked
    def indices(self) -> np.ndarray:
        """Indices [V] (int64) of all valid transitions: step * B + env, so an index names one
        transition for good (its slot, written again T steps later, has another index)."""
        return self._index(np.flatnonzero(self._valid))

    def _index(self, flat: np.ndarray) -> np.ndarray:
        """The indices of ring positions `flat` [N] (slot * B + env) as they hold now."""
        slot, env = np.divmod(flat, self.num_envs)
        return self._steps(slot) * self.num_envs + env

    def _position(self, index: np.ndarray):
        """(slot [N], env [N], step [N], held [N]): where transitions `index` are, and whether
        the ring still holds them (not overwritten since)."""
        step, env = np.divmod(np.asarray(index, np.int64), self.num_envs)
        slot = step % self.time
        return slot, env, step, (step >= 0) & (self._steps(slot) == step)

    @_locked
    def get(self, index: np.ndarray, out=None) -> ReplayBatch:
        """The transitions at `index` [N] (all valid and held), with unit weights; `out`: the
        (observation, next_observation) arrays [N, H, W, stack] to assemble them into."""
        index = np.asarray(index, np.int64)
        slot, env, step, held = self._position(index)
        if not held.all():
            raise ValueError(f"transitions no longer held at indices {index[~held][:8]}")
        valid, ret, disc, boot, trunc, final_id = self._window(step, env)
        if not valid.all():
            raise ValueError(f"invalid transitions at indices {index[~valid][:8]}")
        out = out or (None, None)
        observation = self._observations(step, env, self._start[slot, env], out=out[0])
        boot_start = self._start[(boot - trunc) % self.time, env]  # a truncation's episode
        final = self._final_frames[final_id[trunc] % self.final_capacity]  # [K, H, W]
        next_observation = self._observations(boot, env, boot_start, (trunc, final), out[1])
        return ReplayBatch(
            observation,
            self._action[slot, env],
            ret.astype(np.float32),
            disc.astype(np.float32),
            next_observation,
            np.ones(index.shape, np.float32),
            index,
        )

    @_locked
    def sample(
        self, batch_size: int, beta: float = 0.4, normalize: bool = True, out=None
    ) -> ReplayBatch:
        """Draws `batch_size` valid transitions, uniformly or by priority.

        Args:
            batch_size: N.
            beta: importance-weight exponent: weights are (N_valid * P(i))^-beta over their max.
            normalize: divide the weights by their max (False: the caller normalizes, e.g. over
                a batch drawn from several buffers).
            out: (observation, next_observation) arrays [N, H, W, stack] uint8 to assemble the
                stacks into (e.g. this buffer's rows of a batch drawn from several); None: new.
        """
        if self._num_valid == 0:
            raise ValueError("the replay buffer holds no complete transition yet")
        flat_valid = self._valid.reshape(-1)
        if not self.prioritized:
            index = self._rng.integers(flat_valid.size, size=batch_size)
            for _ in range(8):  # redraw the few invalid draws
                bad = ~flat_valid[index]
                if not bad.any():
                    break
                index[bad] = self._rng.integers(flat_valid.size, size=int(bad.sum()))
            bad = ~flat_valid[index]
            index[bad] = self._rng.choice(np.flatnonzero(flat_valid), int(bad.sum()))
            return self.get(self._index(index), out)
        total = self._tree.total()
        index = self._tree.sample(self._rng.uniform(0.0, total, batch_size))
        bad = ~flat_valid[index]
        for _ in range(8):  # a value at the right edge can round into an empty leaf
            if not bad.any():
                break
            index[bad] = self._tree.sample(self._rng.uniform(0.0, total, int(bad.sum())))
            bad = ~flat_valid[index]
        if bad.any():
            raise RuntimeError(
                f"the sum tree (total {total}) does not match the {self._num_valid} valid "
                "transitions: its draws keep landing on empty slots"
            )
        probability = self._tree.get(index) / total  # [N]
        weight = (self._num_valid * probability) ** -beta
        if normalize:
            weight = weight / weight.max()
        return self.get(self._index(index), out)._replace(weight=weight.astype(np.float32))

    @_locked
    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> None:
        """Sets the priorities [N] (e.g. |TD error|) of sampled transitions `index` [N].

        Stored as max(priority, epsilon)^alpha. Transitions no longer valid, or overwritten
        since they were drawn (a batch drawn ahead, while the sampler adds), are skipped: a new
        transition in their slot keeps its own priority.
        """
        if not self.prioritized:
            return
        slot, env, _, held = self._position(index)
        value = np.maximum(np.asarray(priorities, np.float64), self.epsilon) ** self.alpha
        keep = held & self._valid[slot, env]
        self._tree.update((slot * self.num_envs + env)[keep], value[keep])
        if keep.any():
            self._max_priority = max(self._max_priority, float(value[keep].max()))

    # Arrays with a row per ring slot, filled from slot 0 on (saved up to the last one written),
    # with their initial value, then the others.
    _BY_STEP = {"frames": 0, "action": 0, "reward": 0, "end": 0, "start": 0, "stack_ok": False}
    _BY_STEP |= {"final_id": -1, "valid": False}
    _ARRAYS = ("final_frames", "final_step")
    _SCALARS = ("count", "finals", "num_valid", "max_priority")
    _LOAD_ROWS = 1024  # ring slots copied at a time by `load_state_dict`

    @_locked
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to continue, as numpy arrays (save with `np.savez`).

        The rows of the ring are views, not copies (at 1M transitions they are 8.3 GB), and only
        the rows written so far: save them before the next `add`.
        """
        rows = min(self._count, self.time)
        state = {name: getattr(self, "_" + name)[:rows] for name in self._BY_STEP}
        state.update({name: getattr(self, "_" + name).copy() for name in self._ARRAYS})
        state.update({name: np.asarray(getattr(self, "_" + name)) for name in self._SCALARS})
        state["time"] = np.asarray(self.time)
        state["tree"] = self._tree.nodes.copy()
        rng = self._rng.bit_generator.state
        words = [rng["state"]["state"], rng["state"]["inc"]]
        words = [w >> shift & (2**64 - 1) for w in words for shift in (64, 0)]
        state["rng"] = np.array(words + [rng["has_uint32"], rng["uinteger"]], np.uint64)
        return state

    @_locked
    def load_state_dict(self, state) -> None:
        """Restores `state_dict()`; the next `add` starts a new stream (see the module doc).

        The values are arrays, or for the per-slot rows anything with a `shape` whose row
        slices, taken in order, are arrays (a file read block by block: the 8 GB of frames of a
        full replay need not be in memory twice).

        Raises:
            ValueError: the state belongs to a buffer of other sizes.
        """
        sizes = (int(state["time"]), *state["frames"].shape[1:]) if "time" in state else None
        if sizes not in (None, (self.time, self.num_envs, *self.frame_shape)):
            raise ValueError(
                f"the saved replay keeps {sizes[0]} steps of {sizes[1]} envs of {sizes[2:]} "
                f"frames; this one keeps {self.time} steps of {self.num_envs} envs of "
                f"{self.frame_shape} frames (capacity {self.time * self.num_envs:,})"
            )
        rows = min(int(state["count"]), self.time)
        for name, initial in self._BY_STEP.items():
            target, saved = getattr(self, "_" + name), state[name]
            whole = saved.shape == target.shape  # saved whole, as tfaccel did before
            if saved.shape != (rows, *target.shape[1:]) and not whole:
                raise ValueError(
                    f"{name}: shape {saved.shape}, expected {(rows, *target.shape[1:])} "
                    f"(capacity {self.time * self.num_envs:,})"
                )
            # In blocks of rows, in order: `saved` may be a file read as it is copied.
            for start in range(0, rows, self._LOAD_ROWS):
                stop = min(start + self._LOAD_ROWS, rows)
                target[start:stop] = saved[start:stop]
            target[rows:] = initial
        for name in self._ARRAYS:
            target = getattr(self, "_" + name)
            if target.shape != state[name].shape:
                raise ValueError(f"{name}: shape {state[name].shape}, expected {target.shape}")
            target[...] = state[name]
        for name in self._SCALARS:
            setattr(self, "_" + name, type(getattr(self, "_" + name))(state[name]))
        self._tree.nodes[...] = state["tree"]
        if self.prioritized:  # valid transitions saved by a uniform buffer have no priority yet
            valid = self._valid.reshape(-1)
            unset = np.flatnonzero(valid & (self._tree.get(np.arange(valid.size)) == 0))
            self._tree.update(unset, self._max_priority)
        w = [int(x) for x in state["rng"]]
        self._rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": w[0] << 64 | w[1], "inc": w[2] << 64 | w[3]},
            "has_uint32": w[4],
            "uinteger": w[5],
        }
        self._stream_start = self._count
