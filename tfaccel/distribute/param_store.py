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

Numpy and multiprocessing only; TensorFlow stays in the learners.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import uuid

import numpy as np

from tfaccel.envs.worker import SHM_DIR, map_shared, unmap_shared


class ParameterStore:
    """A flat float32 parameter vector in shared memory, with one lock per chunk.

    Create it in the parent with `ParameterStore.create(size, chunks)`; pass `store.handle()` to
    child processes (spawn or forkserver), which `ParameterStore.attach(handle)`. The creator
    `close(unlink=True)`s it at the end.

    Beside the parameters the segment holds four shared counters, read and written under the
    first chunk's lock: pushes applied, agent steps taken by all learners, a stop request, and
    the agent steps of other machines (an asynchronous run over several machines).

    Attributes:
        size: number of parameters.
        bounds: [(start, stop)] of each chunk.
    """

    _PUSHES, _STEPS, _STOP, _REMOTE_STEPS = range(4)
    lock_timeout = 60.0  # seconds (see `_held`)

    def __init__(self, path: str, block, size: int, locks, owner: bool):
        self.size, self.path, self._block, self._locks, self._owner = (
            size,
            path,
            block,
            locks,
            owner,
        )
        self.bounds = _chunk_bounds(size, len(locks))
        self._header = np.ndarray((4,), np.int64, buffer=block, offset=0)
        self._params = np.ndarray((size,), np.float32, buffer=block, offset=32)

    @classmethod
    def create(
        cls, size: int, chunks: int = 16, context=None, locks=None, name: str | None = None
    ) -> ParameterStore:
        """A zeroed store of `size` parameters in `chunks` chunks (at most one per parameter).

        `locks` (one per chunk) and `name` (a file name in /dev/shm) may come from a parent that
        started the processes which will `attach`: locks can only reach a process when it
        starts.
        """
        if size <= 0:
            raise ValueError(f"a parameter store needs at least one parameter, got {size}")
        if locks is None:
            context = context or multiprocessing.get_context("spawn")
            locks = [context.Lock() for _ in range(max(1, min(int(chunks), size)))]
        path = os.path.join(SHM_DIR, name or f"tfaccel-ps-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        block = map_shared(path, 32 + 4 * size, create=True)
        store = cls(path, block, size, list(locks), owner=True)
        store._header[:] = 0
        store._params[:] = 0.0
        return store

    def handle(self) -> tuple:
        """What a child process needs to `attach` (picklable when passed at process start)."""
        return (os.path.basename(self.path), self.size, self._locks)

    @classmethod
    def attach(cls, handle: tuple) -> ParameterStore:
        """Maps the store of `handle` = (name, size, locks); size None: as large as it is."""
        name, size, locks = handle
        path = os.path.join(SHM_DIR, name)
        if size is None:
            size = (os.path.getsize(path) - 32) // 4
        if os.path.getsize(path) < 32 + 4 * size:
            raise ValueError(f"store {path} holds fewer than {size} parameters")
        return cls(path, map_shared(path, 32 + 4 * size, create=False), size, locks, owner=False)

    def _counter(self, slot: int, add: int = 0) -> int:
        with self._held(self._locks[0]):
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
        with self._held(self._locks[0]):
            self._header[self._REMOTE_STEPS] = int(steps)

    def set_steps(self, steps: int) -> None:
        """Sets the agent-step counter (a resumed run's count)."""
        with self._held(self._locks[0]):
            self._header[self._STEPS] = int(steps)

    def request_stop(self) -> None:
        """Asks every learner to stop."""
        self._counter(self._STOP, 1)

    @property
    def stop_requested(self) -> bool:
        """Whether any learner (or the machine sync) asked to stop."""
        return self._counter(self._STOP) > 0

    def set(self, values: np.ndarray) -> None:
        """Overwrites the parameters (initialization and restore), chunk by chunk under locks."""
        values = self._check(values)
        for lock, (start, stop) in zip(self._locks, self.bounds, strict=True):
            with self._held(lock):
                self._params[start:stop] = values[start:stop]

    def pull(self, out: np.ndarray | None = None) -> np.ndarray:
        """Copies the current parameters into `out` (a new array if None); each chunk is read
        whole under its lock, chunks one after another."""
        out = np.empty(self.size, np.float32) if out is None else self._check(out)
        for lock, (start, stop) in zip(self._locks, self.bounds, strict=True):
            with self._held(lock):
                out[start:stop] = self._params[start:stop]
        return out

    def push(self, delta: np.ndarray) -> None:
        """Adds `delta` [size] to the parameters, chunk by chunk, each under its lock."""
        delta = self._check(delta)
        for lock, (start, stop) in zip(self._locks, self.bounds, strict=True):
            with self._held(lock):
                self._params[start:stop] += delta[start:stop]
        self._counter(self._PUSHES, 1)

    @contextlib.contextmanager
    def _held(self, lock):
        """`lock`, held: a chunk's copy takes microseconds, so one not released in
        `lock_timeout` seconds was held by a learner that died (SIGKILL, OOM) and never will be."""
        if not lock.acquire(timeout=self.lock_timeout):
            raise RuntimeError(
                f"the parameter store's lock was not released in {self.lock_timeout:g} s: a "
                "learner was killed while it held it; the run cannot go on (the same command "
                "resumes from the last checkpoints)"
            )
        try:
            yield
        finally:
            lock.release()

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
