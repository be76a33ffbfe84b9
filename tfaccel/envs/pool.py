"""Many simulators in worker processes, stepped through shared memory, in one or two groups.

The pool of Stooke & Abbeel (2018), section 3: W worker processes each own M envs and step them
serially; observations, rewards, flags, actions and finished-game statistics live in one shared
memory segment; each worker is woken by one byte on a pipe per step of a group and answers with
one byte. Nothing is pickled on the hot path.

With `num_groups=2` the envs form two groups, A and B, and the caller overlaps inference with
simulation, EnvPool-style:

    pool.reset()
    for group in (0, 1):
        pool.send(policy(pool.view(group).observation), group)
    while True:
        for group in (0, 1):
            step = pool.recv(group)               # group's envs stepped
            pool.send(policy(step.observation), group)   # the other group steps meanwhile

Each worker holds M/2 envs of each group, so every worker is busy during either group's step and
starts the next group as soon as its actions are there. Group g is the contiguous slice
`[g * B, (g + 1) * B)` of the envs (B = W * M / num_groups), so a group's observations reach
inference without a copy.

Auto-reset happens inside the worker; see `tfaccel.types.PoolStep` for the convention. An action
of -1 holds an env: it is not stepped and its observation stays (used by the tf-agents adapter).

Faults: an exception in an env, a worker that dies, or a worker that does not answer within
`timeout` seconds raise `PoolError` naming the worker, the env and the cause; the pool is closed
first, so nothing hangs and nothing leaks. Workers ignore SIGINT (the caller handles Ctrl-C and
closes the pool) and exit when the caller's end of their pipe closes, even if it was SIGKILLed.

The worker side (the stepping routine, the buffers, the protocol) is in `tfaccel.envs.worker`.
Numpy only. Env factories are called in the workers and must be picklable and importable from a
module (not a script's `__main__`, which workers do not import: that keeps TensorFlow out of them).
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing as mp
import os
import select
import signal
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from tfaccel.envs.worker import (
    CLOSE,
    ERROR,
    OK,
    RESET,
    WORKER_NAME,
    Buffers,
    PoolError,
    map_shared,
    read_error_message,
    reset_envs,
    step_envs,
    unmap_shared,
    worker_main,
)
from tfaccel.types import Env, EnvSpec, PoolStep

__all__ = ["EnvPool", "SerialPool", "PoolError", "WORKER_NAME", "env_seeds", "EnvFactory"]

EnvFactory = Callable[[int], Env]


_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Independent 31-bit seeds for the envs of a pool, from one seed."""
    state = np.random.SeedSequence(seed).generate_state(num_envs, np.uint32)
    return [int(s) & 0x7FFFFFFF for s in state]


def _check_importable(env_factory) -> None:
    """Workers get the factory by reference; one defined in `__main__` cannot reach them."""
    for part in (env_factory, getattr(env_factory, "func", None)):  # a functools.partial's func
        if part is None:
            continue
        owner = part if inspect.isfunction(part) or inspect.isclass(part) else type(part)
        if owner.__module__ == "__main__":
            raise ValueError(
                f"the env factory {part!r} is defined in __main__, which pool workers do not import "
                "(that keeps TensorFlow out of them); define it in an importable module"
            )


def _layout(
    num_workers: int, envs_per_worker: int, num_groups: int, split_workers: bool
) -> list[list[list[int]]]:
    """indices[w][g]: the pool indices of worker w's envs in group g (each group contiguous).

    Groups inside workers (default): every worker holds envs_per_worker / num_groups envs of each
    group. Groups split by worker: the first W / num_groups workers hold group 0, the rest group 1.
    """
    if split_workers:
        per_group = num_workers // num_groups
        return [
            [
                list(range(w * envs_per_worker, (w + 1) * envs_per_worker))
                if w // per_group == g
                else []
                for g in range(num_groups)
            ]
            for w in range(num_workers)
        ]
    per_group = envs_per_worker // num_groups
    group_size = num_workers * per_group
    return [
        [
            list(range(g * group_size + w * per_group, g * group_size + (w + 1) * per_group))
            for g in range(num_groups)
        ]
        for w in range(num_workers)
    ]


def _check_sizes(num_envs: int, num_groups: int) -> None:
    if num_groups not in (1, 2):
        raise ValueError(f"num_groups must be 1 or 2, got {num_groups}")
    if num_envs <= 0 or num_envs % num_groups:
        raise ValueError(
            f"the envs ({num_envs}) must be positive and split evenly into {num_groups} groups"
        )


class _GroupQueue:
    """The groups sent and not yet received, in order; shared bookkeeping of both pools."""

    def __init__(self, spec: EnvSpec, num_envs: int, num_groups: int):
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
        _check_sizes(num_envs, num_groups)
        self.seeds = env_seeds(seed, num_envs)
        self.envs = [env_factory(s) for s in self.seeds]
        self.spec = self.envs[0].spec
        self.num_envs = num_envs
        self._queue = _GroupQueue(self.spec, num_envs, num_groups)
        self.num_groups, self.group_size = num_groups, self._queue.group_size
        self.buffers = Buffers(self.spec, num_envs)

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
        rows = self._queue.rows(group)
        self.buffers.action[rows] = self._queue.check_actions(actions, group)
        self._queue.pending.append(group)

    def recv(self, group: int = 0) -> PoolStep:
        self._queue.pop(group)
        rows = self._queue.rows(group)
        indices = range(rows.start, rows.stop)
        step_envs([self.envs[i] for i in indices], indices, self.buffers)
        return self.buffers.view(rows)

    def step(self, actions) -> PoolStep:
        """Steps all envs (both groups) and waits; `actions` is [num_envs]."""
        return _step_all(self, actions)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _step_all(pool, actions) -> PoolStep:
    actions = np.asarray(actions)
    if actions.shape != (pool.num_envs,):
        raise ValueError(f"actions must have shape ({pool.num_envs},), got {actions.shape}")
    for group in range(pool.num_groups):
        pool.send(actions[pool._queue.rows(group)], group)
    for group in range(pool.num_groups):
        pool.recv(group)
    return pool.buffers.view(slice(0, pool.num_envs))


@contextlib.contextmanager
def _main_script_hidden():
    """Keeps spawned workers from re-importing the caller's script (and so TensorFlow)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main and k in main.__dict__}
    for key in saved:
        setattr(main, key, None) if key == "__spec__" else delattr(main, key)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


class EnvPool:
    """W worker processes x M envs each, stepped through shared memory. See the module docstring.

    Args:
        env_factory: picklable `seed -> Env`, e.g. `AtariConfig(game="pong")`.
        num_workers: worker processes W.
        envs_per_worker: envs M in each worker, stepped serially (divisible by `num_groups`).
        num_groups: 1 (synchronous) or 2 (alternating groups).
        seed: seeds every env (see `env_seeds`); the same seed gives the same trajectories.
        start_method: "forkserver" (default: fast starts, nothing inherited) or "spawn".
        cpu_affinity: cores to pin workers to, worker w on `cpu_affinity[w % len]` (None: no pin).
        split_groups_by_worker: with two groups, give each worker envs of one group only (W even),
            so a core alternates between stepping its group and inferring for it; by default every
            worker holds envs of both groups.
        worker_niceness: added to the workers' nice value, so the caller's inference and learning
            (the serial path every env waits on) win the cores when they need them.
        timeout: seconds a worker may take for one command before it is declared hung.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        num_workers: int,
        envs_per_worker: int,
        *,
        num_groups: int = 1,
        seed: int = 0,
        start_method: str = "forkserver",
        cpu_affinity: Sequence[int] | None = None,
        split_groups_by_worker: bool = False,
        worker_niceness: int = 0,
        timeout: float = 120.0,
    ):
        if num_workers <= 0 or envs_per_worker <= 0:
            raise ValueError(
                f"num_workers and envs_per_worker must be positive, got {num_workers}, {envs_per_worker}"
            )
        _check_sizes(num_workers * envs_per_worker, num_groups)
        if split_groups_by_worker and num_workers % num_groups:
            raise ValueError(
                f"num_workers ({num_workers}) must split evenly into {num_groups} groups"
            )
        if not split_groups_by_worker and envs_per_worker % num_groups:
            raise ValueError(
                f"envs_per_worker ({envs_per_worker}) must split evenly into {num_groups} groups"
            )
        self.num_envs = num_workers * envs_per_worker
        self.num_workers, self.envs_per_worker, self.timeout = num_workers, envs_per_worker, timeout
        self._niceness = worker_niceness
        _check_importable(env_factory)
        self.seeds = env_seeds(seed, self.num_envs)
        probe = env_factory(self.seeds[0])
        self.spec = probe.spec
        probe.close()
        self._queue = _GroupQueue(self.spec, self.num_envs, num_groups)
        self.num_groups, self.group_size = num_groups, self._queue.group_size
        self._indices = _layout(num_workers, envs_per_worker, num_groups, split_groups_by_worker)
        self._group_workers = [
            [w for w in range(num_workers) if self._indices[w][g]] for g in range(num_groups)
        ]
        self._closed = False
        self._processes: list[mp.Process] = []
        self._commands: list = []
        self._replies: list = []

        nbytes = Buffers.plan(self.spec, self.num_envs)[1]
        self._shm_path = os.path.join(_SHM_DIR, f"tfaccel_{os.getpid()}_{uuid.uuid4().hex[:10]}")
        self._shm = map_shared(self._shm_path, nbytes, create=True)
        self.buffers = Buffers(self.spec, self.num_envs, self._shm)
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            self._processes,
            self._commands,
            self._replies,
            self._shm,
            self._shm_path,
        )
        try:
            self._start(env_factory, start_method, cpu_affinity)
        except BaseException:
            self.close()
            raise
        # Every worker has mapped the segment: its name can go now, so even a SIGKILL of every
        # process leaves nothing in /dev/shm (the memory goes with the last mapping).
        _unlink(self._shm_path)

    def _start(self, env_factory, start_method, cpu_affinity) -> None:
        context = mp.get_context(start_method)
        if start_method == "forkserver":
            context.set_forkserver_preload(["tfaccel.envs.pool"])
        with _main_script_hidden():
            for w in range(self.num_workers):
                command_read, command_write = context.Pipe(duplex=False)
                reply_read, reply_write = context.Pipe(duplex=False)
                core = None if not cpu_affinity else cpu_affinity[w % len(cpu_affinity)]
                seeds = [[self.seeds[i] for i in group] for group in self._indices[w]]
                process = context.Process(
                    target=worker_main,
                    name=f"tfaccel-env-worker-{w}",
                    args=(
                        w,
                        env_factory,
                        seeds,
                        self._indices[w],
                        self.spec,
                        self.num_envs,
                        self._shm_path,
                        command_read,
                        reply_write,
                        core,
                        self._niceness,
                    ),
                    daemon=True,
                )
                process.start()
                command_read.close()
                reply_write.close()
                self._processes.append(process)
                self._commands.append(command_write)
                self._replies.append(reply_read)
        self._wait(range(self.num_workers), "starting")

    def _describe(self, w: int) -> str:
        envs = sorted(i for group in self._indices[w] for i in group)
        return f"worker {w} (pid {self._processes[w].pid}, envs {envs})"

    def _fail(self, message: str):
        self.close()
        raise PoolError(message)

    def _wait(self, workers, what: str) -> None:
        """Reads one reply from each of `workers`; raises PoolError on an error, a death or a hang."""
        waiting = {self._replies[w].fileno(): w for w in workers}
        deadline = time.monotonic() + self.timeout
        while waiting:
            remaining = deadline - time.monotonic()
            ready = (
                select.select(list(waiting), [], [], max(remaining, 0.0))[0]
                if remaining > 0
                else []
            )
            if not ready:
                late = ", ".join(self._describe(w) for w in waiting.values())
                self._fail(f"{late} did not answer within {self.timeout:g} s while {what}: hung?")
            for fd in ready:
                w = waiting.pop(fd)
                byte = os.read(fd, 1)
                if byte == OK:
                    continue
                if byte == ERROR:
                    message = read_error_message(fd)
                    self._fail(f"{self._describe(w)} failed while {what}: {message}")
                self._processes[w].join(1.0)
                self._fail(
                    f"{self._describe(w)} died while {what} ({_exit_reason(self._processes[w].exitcode)})"
                )

    def _check_open(self) -> None:
        if self._closed:
            raise PoolError("the pool is closed")

    def _command(self, byte: int, workers) -> None:
        self._check_open()
        message = bytes((byte,))
        for w in workers:
            try:
                os.write(self._commands[w].fileno(), message)
            except (BrokenPipeError, OSError):
                self._processes[w].join(1.0)
                self._fail(
                    f"{self._describe(w)} is gone ({_exit_reason(self._processes[w].exitcode)})"
                )

    def reset(self) -> PoolStep:
        """Resets every env and returns all first observations (`view(g)` gives a group's)."""
        if self._queue.pending:
            raise RuntimeError(f"reset with groups still pending: {self._queue.pending}")
        self._command(RESET, range(self.num_workers))
        self._wait(range(self.num_workers), "resetting")
        return self.view()

    def view(self, group: int | None = None) -> PoolStep:
        """The current results of `group` (None: all envs), as views."""
        return self.buffers.view(
            slice(0, self.num_envs) if group is None else self._queue.rows(group)
        )

    def send(self, actions, group: int = 0) -> None:
        """Writes `group`'s actions [B] and wakes its workers; returns at once."""
        self._check_open()
        rows = self._queue.rows(group)
        self.buffers.action[rows] = self._queue.check_actions(actions, group)
        self._command(group, self._group_workers[group])
        self._queue.pending.append(group)

    def recv(self, group: int = 0) -> PoolStep:
        """Waits until `group`'s envs have stepped; returns views of the group's results."""
        self._check_open()
        self._queue.pop(group)
        self._wait(self._group_workers[group], f"stepping group {group}")
        return self.buffers.view(self._queue.rows(group))

    def step(self, actions) -> PoolStep:
        """Steps all envs (both groups) and waits; `actions` is [num_envs]."""
        return _step_all(self, actions)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def close(self) -> None:
        """Stops the workers and frees the shared memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _shutdown(processes, commands, replies, shm, shm_path) -> None:
    for connection in commands:
        with contextlib.suppress(OSError):
            os.write(connection.fileno(), bytes((CLOSE,)))
        connection.close()
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.05))
        if process.is_alive():
            process.kill()
            process.join(2.0)
    for connection in replies:
        connection.close()
    _unlink(shm_path)
    unmap_shared(shm)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
