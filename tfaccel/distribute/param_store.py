"""The central parameter store of asynchronous training (Stooke & Abbeel, 2018, section 3.2).

K sampler-learner processes share one flat float32 vector of parameters in shared CPU memory,
split into chunks with one lock each. A learner `pull`s the current parameters, takes n local
optimizer steps on its own copy, and `push`es its change: chunk by chunk, under that chunk's lock,
the store adds the learner's update to whatever the parameters are now (other learners may have
pushed since the pull). Locks are per chunk, so learners pushing at once wait only when they touch
the same chunk at the same moment, and a reader never sees a half-written chunk.

The update rule is the multi-step asynchronous Adam of `AsyncAdam`: each learner keeps its own
Adam moments and step count and sends the change its n local Adam steps made; with one learner
(nobody else moves the parameters between its pull and its push) the result is exactly Adam.

The chunk locks are byte-range locks on the store's own file (`ChunkLocks`), not semaphores: the
kernel releases the locks of a process that dies, and nothing of them is left in /dev/shm when
the whole process group is killed. Numpy and the standard library only; TensorFlow stays in the
learners.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time
import uuid

import numpy as np

from tfaccel.envs.worker import SHM_DIR, map_shared, unmap_shared


class ChunkLocks:
    """One lock per chunk of the store in the file `path`, across processes and threads.

    Chunk k's lock is byte k of the file, locked with `fcntl.lockf` (an advisory record lock:
    it does not touch the data, which the processes read and write through their mappings),
    taken after a thread lock of this process. A record lock belongs to the process: the kernel
    drops it when the process dies, so a learner killed while it held one blocks nobody, and
    there is nothing to clean up after a SIGKILL. Record locks are also dropped when the process
    closes any descriptor of the file: every `ChunkLocks` of one file in a process shares one
    descriptor and one set of thread locks (`_OPEN`, by the file's identity, whatever its name),
    which stays open while any of them does.
    """

    _OPEN: dict[tuple[int, int], list] = {}  # (device, inode) -> [descriptor, thread locks, users]
    _REGISTRY = threading.Lock()

    def __init__(self, path: str, count: int):
        self.count = count
        with self._REGISTRY:
            status = os.stat(path)  # not a second descriptor: closing it would drop our locks
            self._key = (status.st_dev, status.st_ino)
            shared = self._OPEN.get(self._key)
            if shared is None:
                threads = [threading.Lock() for _ in range(count)]
                shared = self._OPEN[self._key] = [os.open(path, os.O_RDWR), threads, 0]
            elif len(shared[1]) != count:
                raise ValueError(f"{path} is open with {len(shared[1])} chunks, not {count}")
            shared[2] += 1
        self._fd, self._threads = shared[0], shared[1]
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def acquire(self, chunk: int, timeout: float) -> bool:
        """Takes chunk `chunk`'s lock; False if it was not free within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        if not self._threads[chunk].acquire(timeout=timeout):
            return False
        delay = 1e-5
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, chunk)
                return True
            except OSError:  # held by another process (EAGAIN or EACCES)
                if time.monotonic() >= deadline:
                    self._threads[chunk].release()
                    return False
                time.sleep(delay)  # a chunk's copy takes microseconds: poll, backing off
                delay = min(2 * delay, 1e-3)

    def release(self, chunk: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, chunk)
        self._threads[chunk].release()

    def close(self) -> None:
        """Closes the shared descriptor once the last `ChunkLocks` of the file in this process
        closes (which releases this process's record locks on it)."""
        if self._closed:
            return
        self._closed = True
        with self._REGISTRY:
            shared = self._OPEN[self._key]
            shared[2] -= 1
            if shared[2] == 0:
                del self._OPEN[self._key]
                os.close(shared[0])


class ParameterStore:
    """A flat float32 parameter vector in shared memory, with one lock per chunk.

    Create it in the parent with `ParameterStore.create(size, chunks)`; pass `store.handle()` to
    child processes (spawn or forkserver), which `ParameterStore.attach(handle)`; a process that
    knows the store's name and size attaches without a handle passed at its start. The creator
    `close(unlink=True)`s it at the end.

    Beside the parameters the segment holds six shared counters, read and written under the
    first chunk's lock: pushes applied, agent steps taken by all learners, a stop request, and,
    for an asynchronous run over several machines, the agent steps of other machines, the
    learners that pushed their last change, and whether the machines' last round is in.

    Attributes:
        size: number of parameters.
        bounds: [(start, stop)] of each chunk.
    """

    _PUSHES, _STEPS, _STOP, _REMOTE_STEPS, _SETTLED, _FINAL = range(6)
    _HEADER = 8 * 6  # bytes of the counters, before the parameters
    lock_timeout = 60.0  # seconds (see `_held`)

    def __init__(self, path: str, block, size: int, locks: ChunkLocks, owner: bool):
        self.size, self.path, self._block, self._locks, self._owner = (
            size,
            path,
            block,
            locks,
            owner,
        )
        self.bounds = _chunk_bounds(size, locks.count)
        self._header = np.ndarray((6,), np.int64, buffer=block, offset=0)
        self._params = np.ndarray((size,), np.float32, buffer=block, offset=self._HEADER)

    @classmethod
    def create(cls, size: int, chunks: int = 16, name: str | None = None) -> ParameterStore:
        """A zeroed store of `size` parameters in `chunks` chunks (at most one per parameter),
        in the file `name` of /dev/shm (default: a new name of this process)."""
        if size <= 0:
            raise ValueError(f"a parameter store needs at least one parameter, got {size}")
        path = os.path.join(SHM_DIR, name or f"tfaccel-ps-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        block = map_shared(path, cls._HEADER + 4 * size, create=True)
        store = cls(path, block, size, ChunkLocks(path, max(1, min(int(chunks), size))), True)
        store._header[:] = 0
        store._params[:] = 0.0
        return store

    def publish(self, name: str) -> None:
        """Renames the store's file to `name` (in /dev/shm) at once: a store created under a
        temporary name and filled first appears whole to the processes that wait for `name`
        (`wait_for`)."""
        path = os.path.join(SHM_DIR, name)
        os.rename(self.path, path)
        self.path = path

    @staticmethod
    def wait_for(name: str, timeout: float, alive=lambda: True, poll: float = 0.2) -> bool:
        """Waits until the store `name` exists (`publish`); False after `timeout` seconds or as
        soon as `alive()` (its creator is alive) is False."""
        path, deadline = os.path.join(SHM_DIR, name), time.monotonic() + timeout
        while not os.path.exists(path):
            if not alive() or time.monotonic() > deadline:
                return False
            time.sleep(poll)
        return True

    def handle(self) -> tuple:
        """What another process needs to `attach`: (name, size, chunks), plain values."""
        return (os.path.basename(self.path), self.size, self._locks.count)

    @classmethod
    def attach(cls, handle: tuple) -> ParameterStore:
        """Maps the store of `handle` = (name, size, chunks); size None: as large as it is."""
        name, size, chunks = handle
        path = os.path.join(SHM_DIR, name)
        if size is None:
            size = (os.path.getsize(path) - cls._HEADER) // 4
        if os.path.getsize(path) < cls._HEADER + 4 * size:
            raise ValueError(f"store {path} holds fewer than {size} parameters")
        # Mapped through the locks' descriptor: opening and closing another one would drop the
        # locks this process holds on the file (another store of it here, in another thread).
        locks = ChunkLocks(path, max(1, min(int(chunks), size)))
        block = mmap.mmap(locks.fileno(), cls._HEADER + 4 * size)
        return cls(path, block, size, locks, owner=False)

    def _counter(self, slot: int, add: int = 0) -> int:
        with self._held(0):
            self._header[slot] += add
            return int(self._header[slot])

    @property
    def pushes(self) -> int:
        """Pushes applied so far."""
        return self._counter(self._PUSHES)

    def add_steps(self, steps: int) -> int:
        """Adds agent steps taken by a learner; returns the total of all learners."""
        return self._counter(self._STEPS, int(steps))

    @property
    def steps(self) -> int:
        """Agent steps of this store's learners (without other machines')."""
        return self._counter(self._STEPS)

    @property
    def remote_steps(self) -> int:
        """Agent steps of the other machines' learners, as the last machine sync reported."""
        return self._counter(self._REMOTE_STEPS)

    def set_remote_steps(self, steps: int) -> None:
        """Records the other machines' agent steps (the machine sync does)."""
        with self._held(0):
            self._header[self._REMOTE_STEPS] = int(steps)

    def set_steps(self, steps: int) -> None:
        """Sets the agent-step counter (a resumed run's count)."""
        with self._held(0):
            self._header[self._STEPS] = int(steps)

    def request_stop(self) -> None:
        """Asks every learner to stop."""
        self._counter(self._STOP, 1)

    @property
    def stop_requested(self) -> bool:
        """Whether any learner (or the machine sync) asked to stop."""
        return self._counter(self._STOP) > 0

    def settle(self) -> None:
        """Counts a learner that pushed its last change (it waits for `final` to save)."""
        self._counter(self._SETTLED, 1)

    @property
    def settled(self) -> int:
        """Learners that pushed their last change."""
        return self._counter(self._SETTLED)

    def set_final(self) -> None:
        """Marks the machines' last round as in the store (or given up): the learners save."""
        self._counter(self._FINAL, 1)

    @property
    def final(self) -> bool:
        """Whether the machines' last round is in the store (`set_final`)."""
        return self._counter(self._FINAL) > 0

    def set(self, values: np.ndarray) -> None:
        """Overwrites the parameters (initialization and restore), chunk by chunk under locks."""
        values = self._check(values)
        for chunk, (start, stop) in enumerate(self.bounds):
            with self._held(chunk):
                self._params[start:stop] = values[start:stop]

    def pull(self, out: np.ndarray | None = None) -> np.ndarray:
        """Copies the current parameters into `out` (a new array if None); each chunk is read
        whole under its lock, chunks one after another."""
        out = np.empty(self.size, np.float32) if out is None else self._check(out)
        for chunk, (start, stop) in enumerate(self.bounds):
            with self._held(chunk):
                out[start:stop] = self._params[start:stop]
        return out

    def push(self, delta: np.ndarray) -> None:
        """Adds `delta` [size] to the parameters, chunk by chunk, each under its lock."""
        delta = self._check(delta)
        for chunk, (start, stop) in enumerate(self.bounds):
            with self._held(chunk):
                self._params[start:stop] += delta[start:stop]
        self._counter(self._PUSHES, 1)

    @contextlib.contextmanager
    def _held(self, chunk: int):
        """Chunk `chunk`'s lock, held: a chunk's copy takes microseconds, so one not released
        in `lock_timeout` seconds is held by a learner that is stopped or hung (one that died
        released it with its life)."""
        if not self._locks.acquire(chunk, self.lock_timeout):
            raise RuntimeError(
                f"the parameter store's lock was not released in {self.lock_timeout:g} s: a "
                "learner holding it is stopped or hung; the run cannot go on (the same command "
                "resumes from the last checkpoints)"
            )
        try:
            yield
        finally:
            self._locks.release(chunk)

    def _check(self, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array)
        if array.shape != (self.size,) or array.dtype != np.float32:
            raise ValueError(
                f"expected float32 [{self.size}] parameters, got {array.dtype} {list(array.shape)}"
            )
        return array

    def close(self, unlink: bool | None = None) -> None:
        """Unmaps the segment; the creator (or `unlink=True`) also removes it."""
        self._params = self._header = None
        unmap_shared(self._block)
        self._locks.close()
        if self._owner if unlink is None else unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _chunk_bounds(size: int, chunks: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, size, chunks + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


class AsyncAdam:
    """Multi-step asynchronous Adam, one instance per learner (numpy reference of the rule).

    A learner holds its own moments m, v and step count t. One round:

    1. `theta = store.pull()`; the learner's copy starts from the current parameters.
    2. n local steps: g_k is the gradient at the learner's copy; Adam with the learner's moments:
       t += 1, m = b1 m + (1 - b1) g_k, v = b2 v + (1 - b2) g_k^2,
       copy -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
       (Kingma & Ba's efficient form of the bias correction, as Keras computes it).
    3. `store.push(copy - theta)`: the change of the n steps is added to the current parameters.

    With one learner, nothing moves the parameters between its pull and its push, so the store
    follows exactly the trajectory of Adam (Kingma & Ba, 2015) with those gradients. With K
    learners, each change lands on parameters that others changed meanwhile (asynchronous
    updates, as in A3C). The learners in `tfaccel` run step 2 with Keras's Adam inside their
    compiled update; this class is the definition the tests check them against.
    """

    def __init__(self, size: int, learning_rate: float, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self.learning_rate, self.beta_1, self.beta_2, self.epsilon = (
            learning_rate,
            beta_1,
            beta_2,
            epsilon,
        )
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)
        self.t = 0

    def step(self, params: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        """One local Adam step on `params` (returns the new params), in float32 and in the order
        of Keras's operations, so that the two agree to rounding."""
        f32 = np.float32
        self.t += 1
        gradient = np.asarray(gradient, f32)
        b1, b2, lr = f32(self.beta_1), f32(self.beta_2), f32(self.learning_rate)
        alpha = lr * np.sqrt(f32(1) - b2 ** f32(self.t)) / (f32(1) - b1 ** f32(self.t))
        self.m += (gradient - self.m) * f32(1 - self.beta_1)
        self.v += (np.square(gradient) - self.v) * f32(1 - self.beta_2)
        return params - (self.m * alpha) / (np.sqrt(self.v) + f32(self.epsilon))

    def round(self, store: ParameterStore, gradient_fn, steps: int = 1) -> None:
        """Pull, `steps` local steps with `gradient_fn(params) -> gradient`, push."""
        start = store.pull()
        params = start.copy()
        for _ in range(steps):
            params = self.step(params, gradient_fn(params))
        store.push(params - start)
