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
first, so nothing hangs and nothing leaks. With `max_restarts` > 0 the pool instead replaces the
worker (fresh envs with new seeds, reset) up to that many times within `restart_window` seconds:
the replaced envs' next step of each group reports reward 0, `truncated` (their episodes are cut,
bootstrapped from the new observation) and no finished game, so the lost games are left out of the
statistics; `drain_faults()` says what happened. One fault more within the window raises.
Workers ignore SIGINT and SIGTERM (the caller handles Ctrl-C and a stop, and closes the pool) and
exit when the caller's end of their pipe closes, even if it was SIGKILLed.

The worker side (the stepping routine, the buffers, the protocol) is in `tfaccel.envs.worker`;
the group bookkeeping both pools share, and `SerialPool`, in `tfaccel.envs.serial_pool`.
Numpy only. Env factories are called in the workers and must be picklable and importable from a
module (not a script's `__main__`, which workers do not import: that keeps TensorFlow out of them).
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import multiprocessing as mp
import os
import re
import select
import signal
import sys
import time
import uuid
import weakref
from collections.abc import Sequence

from tfaccel.envs.serial_pool import (
    EnvFactory,
    GroupQueue,
    SerialPool,
    check_sizes,
    env_seeds,
    step_all,
)
from tfaccel.envs.worker import (
    CLOSE,
    ERROR,
    FATAL,
    OK,
    RESET,
    SHM_DIR,
    WORKER_NAME,
    Buffers,
    PoolError,
    map_shared,
    read_error_message,
    unmap_shared,
    worker_main,
)
from tfaccel.types import PoolStep

__all__ = ["EnvPool", "SerialPool", "PoolError", "WORKER_NAME", "env_seeds", "EnvFactory"]


def _check_layout(num_workers, envs_per_worker, num_groups, split_groups_by_worker) -> None:
    """Raises a ValueError for a layout of workers, envs and groups the pool cannot make."""
    if num_workers <= 0 or envs_per_worker <= 0:
        raise ValueError(
            f"num_workers and envs_per_worker must be positive, got {num_workers}, {envs_per_worker}"
        )
    check_sizes(num_workers * envs_per_worker, num_groups)
    if split_groups_by_worker and num_workers % num_groups:
        raise ValueError(f"num_workers ({num_workers}) must split evenly into {num_groups} groups")
    if not split_groups_by_worker and envs_per_worker % num_groups:
        raise ValueError(
            f"envs_per_worker ({envs_per_worker}) must split evenly into {num_groups} groups"
        )


_SEGMENT_NAME = re.compile(r"tfaccel_(\d+)_[0-9a-f]{10}")  # tfaccel_<pid of its pool>_<random>


def remove_orphaned_segments(directory: str = SHM_DIR, min_age: float = 60.0) -> list[str]:
    """Removes the shared segments of pools whose process is gone, and returns their paths.

    A segment's name goes as soon as its workers have mapped it, so one is left only when its
    pool's process was killed (SIGKILL, the OOM killer) while the workers started; a pool
    sweeps them before it makes its own. Segments younger than `min_age` seconds are kept.
    """
    removed, now = [], time.time()
    for name in os.listdir(directory):
        match = _SEGMENT_NAME.fullmatch(name)
        path = os.path.join(directory, name)
        try:
            if not match or now - os.stat(path).st_mtime < min_age:
                continue
            os.kill(int(match.group(1)), 0)  # raises ProcessLookupError when it is gone
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
        except OSError:  # gone meanwhile, or another user's live process
            continue
    return removed


def _create_segment(path: str, spec, num_envs: int):
    """The shared segment of the pool's buffers, created at `path` and mapped.

    Raises:
        ValueError: it does not fit in SHM_DIR (saying how much it needs and has).
    """
    nbytes = Buffers.plan(spec, num_envs)[1]
    try:
        return map_shared(path, nbytes, create=True)
    except OSError as error:
        stats = os.statvfs(SHM_DIR)
        raise ValueError(
            f"{num_envs} envs need {nbytes / 2**20:,.0f} MiB of shared memory and "
            f"{SHM_DIR} has {stats.f_bavail * stats.f_frsize / 2**20:,.0f} MiB free "
            f"({error.strerror}): use fewer envs, or give {SHM_DIR} more room (in Docker: "
            "--shm-size)"
        ) from None


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


@contextlib.contextmanager
def signals_blocked_while_starting(*signals: signal.Signals):
    """`signals` blocked in this thread while processes start inside: a new process inherits
    the mask (through fork and exec alike), so a signal to the whole process group waits in it,
    pending, until it unblocks them or sets its own handling. This process still gets the
    signal, in another thread or once the mask is restored.

    The pool's workers (and the first time, the forkserver) start with SIGINT and SIGTERM
    blocked: a Ctrl-C or a SIGTERM to the whole group (a job scheduler's stop, `kill -- -PGID`)
    reaches the caller alone, which saves and closes the pool; without it the workers die with
    it, are replaced as faults, and the run ends with a worker error.

    multiprocessing's resource tracker unblocks SIGINT and SIGTERM in the thread that starts it,
    which is the first one to start a process: it is started before the mask is set.
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
        max_restarts: worker replacements allowed within `restart_window` seconds (0: a fault
            raises at once).
        restart_window: seconds over which replacements are counted.
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
        max_restarts: int = 0,
        restart_window: float = 600.0,
    ):
        _check_layout(num_workers, envs_per_worker, num_groups, split_groups_by_worker)
        if max_restarts < 0 or restart_window <= 0:
            raise ValueError(
                f"max_restarts must be >= 0 and restart_window > 0, got {max_restarts}, "
                f"{restart_window}"
            )
        self.num_envs = num_workers * envs_per_worker
        self.num_workers, self.envs_per_worker, self.timeout = num_workers, envs_per_worker, timeout
        self._niceness = worker_niceness
        _check_importable(env_factory)
        self.seeds = env_seeds(seed, self.num_envs)
        probe = env_factory(self.seeds[0])
        self.spec = probe.spec
        probe.close()
        self._queue = GroupQueue(self.spec, self.num_envs, num_groups)
        self.num_groups, self.group_size = num_groups, self._queue.group_size
        self._indices = _layout(num_workers, envs_per_worker, num_groups, split_groups_by_worker)
        self._group_workers = [
            [w for w in range(num_workers) if self._indices[w][g]] for g in range(num_groups)
        ]
        self._closed = False
        self._processes: list[mp.Process] = []
        self._commands: list = []
        self._replies: list = []
        self._seed, self._factory, self._affinity = seed, env_factory, cpu_affinity
        self._context = mp.get_context(start_method)
        self.max_restarts, self.restart_window = max_restarts, restart_window
        self.restarts = 0  # workers replaced so far
        self._restart_times: list[float] = []
        self._faults: list[str] = []
        self._replaced: list[set[int]] = [set() for _ in range(num_groups)]  # rows to mark

        remove_orphaned_segments()
        self._shm_path = os.path.join(SHM_DIR, f"tfaccel_{os.getpid()}_{uuid.uuid4().hex[:10]}")
        self._shm = _create_segment(self._shm_path, self.spec, self.num_envs)
        self.buffers = Buffers(self.spec, self.num_envs, self._shm)
        # An open descriptor keeps the segment reachable for replacement workers (through
        # /proc/<pid>/fd) after its name is gone.
        self._shm_fd = os.open(self._shm_path, os.O_RDWR)
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            self._processes,
            self._commands,
            self._replies,
            self._shm,
            self._shm_path,
            self._shm_fd,
        )
        self._start(start_method)

    def _start(self, start_method: str) -> None:
        """Starts every worker on the segment and waits for their answers; then the segment's
        name goes (closing the pool on any failure)."""
        try:
            if start_method == "forkserver":
                self._context.set_forkserver_preload(["tfaccel.envs.pool"])
            for w in range(self.num_workers):
                self._spawn(w, self._shm_path)
            self._wait(range(self.num_workers), "starting")
        except BaseException:
            self.close()
            raise
        # At exit, before multiprocessing's own exit function (registered when the first worker
        # started; atexit runs the last registered first), which would SIGTERM the workers, which
        # ignore it, and wait for them forever.
        atexit.register(self._finalizer)
        # Every worker has mapped the segment: its name can go now, so even a SIGKILL of every
        # process leaves nothing in /dev/shm (the memory goes with the last mapping).
        _unlink(self._shm_path)

    def _spawn(self, w: int, shm_path: str) -> None:
        """Starts worker `w` on the segment at `shm_path` (its answer is awaited by the caller)."""
        command_read, command_write = self._context.Pipe(duplex=False)
        reply_read, reply_write = self._context.Pipe(duplex=False)
        affinity = self._affinity
        core = None if not affinity else affinity[w % len(affinity)]
        seeds = [[self.seeds[i] for i in group] for group in self._indices[w]]
        args = (w, self._factory, seeds, self._indices[w], self.spec, self.num_envs, shm_path)
        with _main_script_hidden(), signals_blocked_while_starting(signal.SIGINT, signal.SIGTERM):
            process = self._context.Process(
                target=worker_main,
                name=f"tfaccel-env-worker-{w}",
                args=(*args, command_read, reply_write, core, self._niceness),
                daemon=True,
            )
            process.start()
        command_read.close()
        reply_write.close()
        if w < len(self._processes):
            self._processes[w], self._commands[w], self._replies[w] = (
                process, command_write, reply_read
            )  # fmt: skip
        else:
            self._processes.append(process)
            self._commands.append(command_write)
            self._replies.append(reply_read)

    def _replace(self, w: int, fault: str, answered_group: int | None) -> None:
        """Replaces worker `w` after `fault` (or raises `PoolError` when that is one fault too
        many): new process, fresh envs with new seeds, reset; the group commands it still owed
        are sent again, except `answered_group`'s, whose wait it ends."""
        now = time.monotonic()
        self._restart_times = [t for t in self._restart_times if now - t < self.restart_window]
        if len(self._restart_times) >= self.max_restarts:
            limit = (
                f"; {len(self._restart_times)} replaced within {self.restart_window:g} s already"
            )
            first, *detail = fault.splitlines()
            self._fail("\n".join([first + (limit if self.max_restarts else ""), *detail]))
        self._restart_times.append(now)
        self.restarts += 1
        old = self._processes[w]
        if old.is_alive():
            old.kill()
        old.join(2.0)
        self._commands[w].close()
        self._replies[w].close()
        envs = sorted(i for group in self._indices[w] for i in group)
        fresh = env_seeds(hash((self._seed, self.restarts)) & 0x7FFFFFFF, len(envs))
        for i, seed in zip(envs, fresh, strict=True):
            self.seeds[i] = seed
        self._spawn(w, f"/proc/{os.getpid()}/fd/{self._shm_fd}")
        self._wait_strict([w], "starting a replacement")
        os.write(self._commands[w].fileno(), bytes((RESET,)))
        self._wait_strict([w], "resetting a replacement")
        for g in range(self.num_groups):
            self._replaced[g].update(self._indices[w][g])
        for g in self._queue.pending:
            if g != answered_group and self._indices[w][g]:
                os.write(self._commands[w].fileno(), bytes((g,)))
        self._faults.append(
            f"{fault.splitlines()[0]}; replaced by pid {self._processes[w].pid} with fresh envs "
            f"({len(self._restart_times)} of {self.max_restarts} allowed in "
            f"{self.restart_window:g} s)"
        )

    def drain_faults(self) -> list[str]:
        """What went wrong with workers, and what the pool did, since the last call."""
        faults, self._faults = self._faults, []
        return faults

    def _wait_strict(self, workers, what: str) -> None:
        """`_wait` that raises on any fault (no replacement: for starting replacements)."""
        self._wait(workers, what, replaceable=False)

    def _describe(self, w: int) -> str:
        envs = sorted(i for group in self._indices[w] for i in group)
        return f"worker {w} (pid {self._processes[w].pid}, envs {envs})"

    def _fail(self, message: str):
        self.close()
        raise PoolError(message)

    def _wait(
        self, workers, what: str, group: int | None = None, replaceable: bool | None = None
    ) -> None:
        """Reads one reply from each of `workers` (stepping `group`, if any); an error, a death
        or a hang raises PoolError, or replaces the worker where `max_restarts` allows (in a
        step or a reset, not at the start)."""
        replaceable = bool(self.max_restarts) and (group is not None or bool(replaceable))
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
                for w in list(waiting.values()):
                    fault = f"{self._describe(w)} did not answer within {self.timeout:g} s"
                    self._handle(w, f"{fault} while {what}: hung?", group, replaceable)
                return
            for fd in ready:
                w = waiting.pop(fd)
                byte = os.read(fd, 1)
                if byte == OK:
                    continue
                if byte in (ERROR, FATAL):
                    message = read_error_message(fd)
                    fault = f"{self._describe(w)} failed while {what}: {message}"
                    self._handle(w, fault, group, replaceable and byte == ERROR)
                    continue
                self._processes[w].join(1.0)
                reason = exit_reason(self._processes[w].exitcode)
                fault = f"{self._describe(w)} died while {what} ({reason})"
                self._handle(w, fault, group, replaceable)

    def _handle(self, w: int, fault: str, group: int | None, replaceable: bool) -> None:
        """A fault of worker `w` while it owed `group`'s step (None: a reset or a start)."""
        if not replaceable:
            self._fail(fault)
        self._replace(w, fault, group)

    def _unread_error(self, w: int) -> tuple[str | None, bool]:
        """The error message worker `w` sent and nobody read yet (its replies are discarded: a
        replacement answers the commands it owed), or None; and whether it was FATAL."""
        fd = self._replies[w].fileno()
        while select.select([fd], [], [], 0)[0]:
            byte = os.read(fd, 1)
            if byte in (ERROR, FATAL):
                return read_error_message(fd), byte == FATAL
            if byte != OK:  # end of the pipe
                return None, False
        return None, False

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
                reason = exit_reason(self._processes[w].exitcode)
                error, fatal = self._unread_error(w)  # it failed on an earlier command, then exited
                fault = f"{self._describe(w)} " + (
                    f"failed: {error}" if error else f"is gone ({reason})"
                )
                if not self.max_restarts or byte == RESET or fatal:
                    self._fail(fault)
                self._replace(w, fault, None)
                os.write(self._commands[w].fileno(), message)

    def reset(self) -> PoolStep:
        """Resets every env and returns all first observations (`view(g)` gives a group's)."""
        if self._queue.pending:
            raise RuntimeError(f"reset with groups still pending: {self._queue.pending}")
        self._command(RESET, range(self.num_workers))
        self._wait(range(self.num_workers), "resetting", replaceable=True)
        for replaced in self._replaced:  # a reset starts every episode afresh anyway
            replaced.clear()
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
        self._wait(self._group_workers[group], f"stepping group {group}", group)
        if self._replaced[group]:
            self._mark_replaced(group)
        return self.buffers.view(self._queue.rows(group))

    def _mark_replaced(self, group: int) -> None:
        """The first step of a replacement's envs in `group`: their episodes were cut by the
        fault, so no reward and no finished game; truncated, bootstrapped from where they are."""
        rows = sorted(self._replaced[group])
        self._replaced[group].clear()
        b = self.buffers
        b.reward[rows], b.terminated[rows], b.truncated[rows] = 0.0, False, True
        b.game_over[rows] = False
        b.final_observation[rows] = b.observation[rows]

    def step(self, actions) -> PoolStep:
        """Steps all envs (both groups) and waits; `actions` is [num_envs]."""
        return step_all(self, actions)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, worker 0 first."""
        return [p.pid for p in self._processes]

    def close(self) -> None:
        """Stops the workers and frees the shared memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        atexit.unregister(self._finalizer)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _shutdown(processes, commands, replies, shm, shm_path, shm_fd) -> None:
    for connection in commands:
        with contextlib.suppress(OSError):
            os.write(connection.fileno(), bytes((CLOSE,)))
        connection.close()
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.05))
        if process.is_alive():
            process.kill()  # cannot be ignored; the wait is for the reaping, slow under load
            process.join(30.0)
    for connection in replies:
        connection.close()
    _unlink(shm_path)
    with contextlib.suppress(OSError):
        os.close(shm_fd)
    unmap_shared(shm)


def exit_reason(code: int | None) -> str:
    """Why a process ended, from its exit code: `killed by SIGKILL`, `exit code 1`."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
