"""The group bookkeeping every pool shares, and `SerialPool`: the pool's semantics in one process.

`SerialPool` steps its envs one after another in the caller's process, with the same interface
and the same `step_envs` as `EnvPool`: the reference the tests compare `EnvPool` with, the
simplest way to debug an env, and the pool of `PoolConfig.num_workers = 0` (an env defined in a
notebook). `GroupQueue` keeps the order of the groups' sends and receives for both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tfaccel.envs.worker import Buffers, reset_envs, step_envs
from tfaccel.types import Env, EnvSpec, PoolStep, check_spec

EnvFactory = Callable[[int], Env]


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Independent 31-bit seeds for the envs of a pool, from one seed."""
    state = np.random.SeedSequence(seed).generate_state(num_envs, np.uint32)
    return [int(s) & 0x7FFFFFFF for s in state]


def check_sizes(num_envs: int, num_groups: int) -> None:
    if num_groups not in (1, 2):
        raise ValueError(f"num_groups must be 1 or 2, got {num_groups}")
    if num_envs <= 0 or num_envs % num_groups:
        raise ValueError(
            f"the envs ({num_envs}) must be positive and split evenly into {num_groups} groups"
        )


class GroupQueue:
    """The groups sent and not yet received, in order; shared bookkeeping of both pools."""

    def __init__(self, spec: EnvSpec, num_envs: int, num_groups: int):
        check_spec(spec)
        self.spec, self.num_groups = spec, num_groups
        self.group_size = num_envs // num_groups
        self.pending: list[int] = []

    def rows(self, group: int) -> slice:
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group must be in [0, {self.num_groups}), got {group}")
        return slice(group * self.group_size, (group + 1) * self.group_size)

    def check_actions(self, actions, group: int) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.group_size,) or actions.dtype.kind not in "iu":
            raise ValueError(
                f"actions must be integers of shape ({self.group_size},) for group {group}, "
                f"got {actions.dtype} {actions.shape}"
            )
        if group in self.pending:
            raise RuntimeError(
                f"group {group} was sent already; recv({group}) before sending it again"
            )
        if actions.size and (actions.max() >= self.spec.num_actions or actions.min() < -1):
            raise ValueError(
                f"actions must be in [0, {self.spec.num_actions}) or -1 (hold), got {actions}"
            )
        return actions

    def pop(self, group: int) -> None:
        if not self.pending or self.pending[0] != group:
            raise RuntimeError(
                f"recv({group}) out of order: groups pending, oldest first: {self.pending}"
            )
        self.pending.pop(0)


class SerialPool:
    """The pool's semantics in this process, one env after another: the reference for tests and
    the simplest way to debug an env. Same constructor arguments as `EnvPool` without workers.
    """

    def __init__(
        self, env_factory: EnvFactory, num_envs: int, *, num_groups: int = 1, seed: int = 0
    ):
        check_sizes(num_envs, num_groups)
        self.seeds = env_seeds(seed, num_envs)
        self.envs = [env_factory(s) for s in self.seeds]
        self.spec = self.envs[0].spec
        self.num_envs = num_envs
        self._queue = GroupQueue(self.spec, num_envs, num_groups)
        self.num_groups, self.group_size = num_groups, self._queue.group_size
        self.buffers = Buffers(self.spec, num_envs)
        self.restarts = 0  # an env that fails here raises: nothing is replaced

    def drain_faults(self) -> list[str]:
        """Nothing to report: in one process a failing env raises at once."""
        return []

    def reset(self) -> PoolStep:
        """Resets every env and returns all first observations (`view(g)` gives a group's)."""
        if self._queue.pending:
            raise RuntimeError(f"reset with groups still pending: {self._queue.pending}")
        reset_envs(self.envs, range(self.num_envs), self.buffers)
        return self.view()

    def view(self, group: int | None = None) -> PoolStep:
        """The current results of `group` (None: all envs), as views."""
        return self.buffers.view(
            slice(0, self.num_envs) if group is None else self._queue.rows(group)
        )

    def send(self, actions, group: int = 0) -> None:
        """Records `group`'s actions [B]; the envs step in `recv`."""
        rows = self._queue.rows(group)
        self.buffers.action[rows] = self._queue.check_actions(actions, group)
        self._queue.pending.append(group)

    def recv(self, group: int = 0) -> PoolStep:
        """Steps `group`'s envs one after another; returns views of the group's results."""
        self._queue.pop(group)
        rows = self._queue.rows(group)
        indices = range(rows.start, rows.stop)
        step_envs([self.envs[i] for i in indices], indices, self.buffers)
        return self.buffers.view(rows)

    def step(self, actions) -> PoolStep:
        """Steps all envs (both groups) and waits; `actions` is [num_envs]."""
        return step_all(self, actions)

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def step_all(pool, actions) -> PoolStep:
    actions = np.asarray(actions)
    if actions.shape != (pool.num_envs,):
        raise ValueError(f"actions must have shape ({pool.num_envs},), got {actions.shape}")
    for group in range(pool.num_groups):
        pool.send(actions[pool._queue.rows(group)], group)
    for group in range(pool.num_groups):
        pool.recv(group)
    return pool.buffers.view(slice(0, pool.num_envs))
