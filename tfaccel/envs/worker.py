"""The worker side of the env pool, and what both sides share: buffers, stepping, the protocol.

A worker maps the pool's shared segment, builds its envs, answers "ready", then loops: one command
byte in (step group g, reset, close), one reply byte out (ok, or error followed by a message).
`step_envs` and `reset_envs` are the one stepping routine: workers and `SerialPool` both run them.
Numpy only.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import struct
import tempfile
import traceback
from collections.abc import Sequence

import numpy as np

from tfaccel.types import Env, EnvSpec, PoolStep

RESET, CLOSE = 254, 255  # command bytes; 0..253 step that group
# Reply bytes: FATAL is an error no replacement of the worker would mend (an env that breaks its
# spec), which the pool does not retry.
OK, ERROR, FATAL = b"K", b"E", b"F"
WORKER_NAME = "tfaccel-w"  # worker processes are named tfaccel-w0, tfaccel-w1, ... in ps
_ALIGN = 64


class PoolError(RuntimeError):
    """A worker or one of its envs failed; the message names which and why."""


class SpecMismatch(PoolError):
    """An env returned an observation its spec does not describe: it will do so again."""


def _fields(spec: EnvSpec, n: int) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    obs_shape, obs_dtype = (n, *spec.observation.shape), np.dtype(spec.observation.dtype)
    return [
        ("observation", obs_shape, obs_dtype),
        ("reward", (n,), np.dtype(np.float32)),
        ("terminated", (n,), np.dtype(np.bool_)),
        ("truncated", (n,), np.dtype(np.bool_)),
        ("final_observation", obs_shape, obs_dtype),
        ("game_over", (n,), np.dtype(np.bool_)),
        ("game_return", (n,), np.dtype(np.float64)),
        ("game_length", (n,), np.dtype(np.int64)),
        ("action", (n,), np.dtype(np.int32)),
    ]


class Buffers:
    """Numpy views of the pool's arrays over one flat buffer (shared memory or plain bytes)."""

    def __init__(self, spec: EnvSpec, num_envs: int, buffer=None):
        layout, nbytes = self.plan(spec, num_envs)
        if buffer is None:
            buffer = bytearray(nbytes)
        a = self.arrays = {
            name: np.ndarray(shape, dtype, buffer=buffer, offset=start)
            for name, shape, dtype, start in layout
        }
        self.observation, self.reward, self.action = a["observation"], a["reward"], a["action"]
        self.terminated, self.truncated = a["terminated"], a["truncated"]
        self.final_observation, self.game_over = a["final_observation"], a["game_over"]
        self.game_return, self.game_length = a["game_return"], a["game_length"]

    @staticmethod
    def plan(spec: EnvSpec, num_envs: int) -> tuple[list, int]:
        """(name, shape, dtype, byte offset) of each array, each aligned to 64 bytes; total bytes."""
        layout, offset = [], 0
        for name, shape, dtype in _fields(spec, num_envs):
            layout.append((name, shape, dtype, offset))
            offset += -(-int(np.prod(shape)) * dtype.itemsize // _ALIGN) * _ALIGN
        return layout, offset

    def view(self, rows: slice) -> PoolStep:
        """The arrays of `rows` as a `PoolStep` of views (no copy)."""
        return PoolStep(*(self.arrays[name][rows] for name in PoolStep._fields))


def _fitted(observation, array: np.ndarray, i: int):
    """`observation` as it can go into row `i` of `array` (the pool's observations).

    Exactly the spec's dtype and shape is the fast path. Another dtype goes in when numpy casts
    it safely (uint8 into float32), from float to float (float64 into float32), or when the
    cast keeps every value (Python ints of 0-255 into uint8); anything else numpy's assignment
    would change without a word (0.5 into a uint8 is 0, 300 is 44, a scalar fills the row).

    Raises:
        SpecMismatch: an observation of another shape, or one the cast would change.
    """
    dtype, shape = array.dtype, array.shape[1:]
    if (
        getattr(observation, "dtype", None) == dtype
        and getattr(observation, "shape", None) == shape
    ):
        return observation
    try:
        given = np.asarray(observation)
        if given.shape == shape:
            floats = given.dtype.kind == "f" and dtype.kind == "f"
            if np.can_cast(given.dtype, dtype, "safe") or floats:
                return given
            cast = given.astype(dtype)
            if np.array_equal(cast, given):
                return cast
        described = f"dtype {given.dtype} and shape {given.shape}"
    except (TypeError, ValueError, OverflowError) as error:  # ragged, or objects numpy cannot cast
        described = f"{type(observation).__name__} that numpy cannot turn into {dtype} ({error})"
    raise SpecMismatch(
        f"env {i} returned an observation of {described}, but its spec says {dtype} {shape}: "
        f"return np.asarray(observation, {dtype.name!r}) of that shape, or declare the spec "
        "the env has"
    )


def reset_envs(envs: Sequence[Env], indices: Sequence[int], buffers: Buffers) -> None:
    """Resets `envs` and writes their first observations at `indices`; clears their flags."""
    for env, i in zip(envs, indices, strict=True):
        buffers.observation[i] = _fitted(env.reset(), buffers.observation, i)
        buffers.reward[i] = 0.0
        buffers.terminated[i] = buffers.truncated[i] = buffers.game_over[i] = False


def step_envs(envs: Sequence[Env], indices: Sequence[int], buffers: Buffers) -> None:
    """Steps each env with `buffers.action` at its index and writes the results there.

    The one stepping routine of the pool: workers and `SerialPool` both run it.
    """
    for env, i in zip(envs, indices, strict=True):
        action = int(buffers.action[i])
        if action < 0:  # held: not stepped
            buffers.reward[i] = 0.0
            buffers.terminated[i] = buffers.truncated[i] = buffers.game_over[i] = False
            continue
        try:
            result = env.step(action)
            ended = result.terminated or result.truncated
            buffers.reward[i] = result.reward
            buffers.terminated[i] = result.terminated
            buffers.truncated[i] = result.truncated
            if ended:
                buffers.final_observation[i] = _fitted(result.observation, buffers.observation, i)
                game = env.game
                buffers.game_over[i] = game.over
                if game.over:
                    buffers.game_return[i] = game.score
                    buffers.game_length[i] = game.length
                buffers.observation[i] = _fitted(env.reset(), buffers.observation, i)
            else:
                buffers.game_over[i] = False
                buffers.observation[i] = _fitted(result.observation, buffers.observation, i)
        except PoolError:
            raise
        except Exception as error:
            raise PoolError(f"env {i} raised {type(error).__name__}: {error}") from error


# Where shared blocks live (the env pool's buffers, the parameter store): memory, where there is a
# /dev/shm.
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def map_shared(path: str, size: int, create: bool) -> mmap.mmap:
    """Maps the shared file `path` (created with `size` bytes when `create`).

    A created file gets its space at once (`posix_fallocate`), so a full /dev/shm is an
    `OSError` (ENOSPC) here rather than a SIGBUS at some later write; the file is then removed.
    """
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            try:
                os.ftruncate(fd, size)
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, size)
            except OSError:
                os.unlink(path)
                raise
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def unmap_shared(block: mmap.mmap) -> None:
    """Unmaps now if no views are left; otherwise the last view to go unmaps it (no dangling view)."""
    with contextlib.suppress(BufferError):
        block.close()


def read_error_message(fd: int) -> str:
    header = os.read(fd, 4)
    if len(header) < 4:
        return "(no message)"
    (length,) = struct.unpack("<I", header)
    data = b""
    while len(data) < length:
        chunk = os.read(fd, length - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def _send_error(fd: int, message: str, fatal: bool = False) -> None:
    data = message.encode("utf-8")
    with contextlib.suppress(BrokenPipeError):  # the trainer is gone: nobody to tell
        os.write(fd, (FATAL if fatal else ERROR) + struct.pack("<I", len(data)) + data)


def _set_process_name(name: str) -> None:
    """Names the process for `ps`/`top` (Linux: 15 characters at most)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def worker_main(
    index, env_factory, seeds, indices, spec, num_envs, shm_path, commands, replies, core, niceness
) -> None:
    """A worker's life: attach, build envs, then one command byte in, one reply byte out."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # the caller stops and closes the pool
        signal.signal(stop, signal.SIG_IGN)
    _set_process_name(f"{WORKER_NAME}{index}")
    command_fd, reply_fd = commands.fileno(), replies.fileno()
    shm = None
    try:
        if niceness:
            os.nice(niceness)
        if core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})
        shm = map_shared(shm_path, Buffers.plan(spec, num_envs)[1], create=False)
        buffers = Buffers(spec, num_envs, shm)
        envs = [[env_factory(seed) for seed in group] for group in seeds]
        os.write(reply_fd, OK)
    except Exception as error:  # BrokenPipeError too: the trainer stopped while this one started
        _send_error(reply_fd, f"could not start: {type(error).__name__}: {error}")
        return
    try:
        while True:
            command = os.read(command_fd, 1)
            if not command or command[0] == CLOSE:
                break
            try:
                if command[0] == RESET:
                    for group, group_indices in zip(envs, indices, strict=True):
                        reset_envs(group, group_indices, buffers)
                else:
                    step_envs(envs[command[0]], indices[command[0]], buffers)
            except Exception as error:
                detail = "".join(traceback.format_exception(error)[-3:]).strip()
                _send_error(reply_fd, f"{error}\n{detail}", fatal=isinstance(error, SpecMismatch))
                break
            os.write(reply_fd, OK)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        for group in envs:
            for env in group:
                env.close()
