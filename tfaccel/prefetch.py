"""Batches drawn ahead in a background thread, off the learner's critical path.

Numpy only (and the standard library).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Prefetcher:
    """Draws the learner's next batches in a background thread, off its critical path.

    `sample_fn()` runs in the thread and its batches wait in a queue of `depth`; `get()` takes the
    oldest. Numpy's gathers release the GIL, so a batch is assembled while the learner's
    TensorFlow step (which releases it too) runs. A batch is therefore drawn up to `depth + 1`
    steps before it is used: the priorities and new transitions of those steps are not yet seen
    by it (sampling order, unlike with direct sampling, depends on thread timing). An exception
    in `sample_fn` is raised again by `get()`.
    """

    def __init__(self, sample_fn: Callable[[], object], depth: int = 1):
        self._sample_fn = sample_fn
        self._queue: queue.Queue = queue.Queue(maxsize=max(int(depth), 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfaccel-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = (self._sample_fn(), None)
            except Exception as error:  # handed to the consumer, which raises it
                item = (None, error)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return

    def get(self):
        """The next batch (waits for it); raises what `sample_fn` raised."""
        while True:
            try:
                batch, error = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the prefetch thread has stopped") from None
        if error is not None:
            raise error
        return batch

    def close(self) -> None:
        """Stops the thread; batches not taken are dropped."""
        self._stop.set()
        self._thread.join(timeout=10.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
