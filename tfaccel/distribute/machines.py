"""Asynchronous learners inside each machine, synchronous across machines (Distributed BA3C).

Adamski et al. (2018) run batch A3C asynchronously inside a node and synchronously across nodes.
Here each machine runs the asynchronous run of `tfaccel.distribute.asynchronous` (K learners
around its own parameter store), and its launcher process joins the other machines' launchers
in a `MultiWorkerMirroredStrategy` (the cluster of `TF_CONFIG` or Slurm, CPU only: the GPUs are
the learners'). Learners never wait for other machines; only the launchers do, in rounds:

    round 0:  every store starts from machine 0's parameters (theta_last := theta_0)
    round r:  delta_m = pull(store_m) - theta_last           (machine m's progress since r-1)
              theta = theta_last + mean_m(delta_m)           (one all-reduce of the deltas)
              push(store_m, theta - pull)                     (an addition: the learners' pushes
              theta_last := theta                              made meanwhile are kept)

so every `period_seconds` the machines average what their learners did, like the gradient
average of a synchronous step, but over all the asynchronous steps since the last round. The last
round, once the learners have pushed their last change (they wait for it to save), sets theta in
every store (rather than adding to it, which rounds differently on each machine), and the
learners save it: every machine ends with the same parameters.

Agent steps: each round also sums the steps every machine's learners took, and tells each store
the other machines' share, so learners log and stop on the frames of the whole run. A stop (the
total reached, Ctrl-C, a failed learner) on any machine stops all of them at the next round.

A launcher collective that waits `make_strategy.timeout_seconds` for a machine that died fails;
the surviving launchers stop their learners (which save a checkpoint) and end with one line.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tensorflow as tf

from tfaccel.distribute import strategies
from tfaccel.distribute.param_store import ParameterStore


def collective_strategy() -> tf.distribute.Strategy:
    """The launchers' `MultiWorkerMirroredStrategy` (gin's `make_strategy` settings for the
    cluster and the timeout), on the CPU: this process only moves parameters."""
    tf.config.set_visible_devices([], "GPU")
    return strategies.make_strategy(kind="multi_worker", cpu_only=True)


def settle_seconds() -> float:
    """How long a launcher waits at a stop for its learners' last changes before the last
    round (a learner still busy then misses it): a quarter of the collective's timeout, which
    the other machines' launchers wait in meanwhile, and 10 s at most (a learner waits for the
    round before it saves, and a job scheduler's SIGKILL follows its SIGTERM)."""
    return min(10.0, strategies.collective_timeout() / 4)


class MachineSync:
    """This machine's side of the rounds above, over `store` (see the module docstring).

    Args:
        strategy: the launchers' multi-worker strategy (`collective_strategy()`).
        store: this machine's parameter store, attached.
    """

    def __init__(self, strategy: tf.distribute.Strategy, store: ParameterStore):
        self.machines = strategies.num_workers(strategy)
        self.index = strategies.worker_index(strategy)
        self._sum = strategies.WorkerSum(strategy)
        self._store = store
        self._last: np.ndarray | None = None
        self._base_steps = 0  # this store's steps at round 0 (a resume restores the total)
        self._start_steps = 0  # machine 0's steps at round 0: the run's steps before this start
        self.rounds = 0

    def round(self, stop: bool, last: bool = False) -> bool:
        """One round; returns True when any machine asked to stop (then all do). The `last`
        round (every machine's learners stopped) sets the store to theta."""
        now = self._store.pull()
        steps = self._store.steps
        if self._last is None:
            self._base_steps = steps
            start = now if self.index == 0 else np.zeros_like(now)
            first = np.float64(steps if self.index == 0 else 0)
            theta, start_steps, votes = self._sum(start, first, np.float32(stop))
            self._start_steps = int(start_steps)
            total = self._start_steps
        else:
            delta = now - self._last
            progress = np.float64(steps - self._base_steps)
            summed, done, votes = self._sum(delta, progress, np.float32(stop))
            theta = self._last + summed / np.float32(self.machines)
            total = self._start_steps + int(done)
        if last:
            self._store.set(theta)
        else:  # learners push meanwhile: an addition keeps their changes
            self._store.push(theta - now)
        self._last = theta
        self._store.set_remote_steps(total - steps)
        self.rounds += 1
        if votes > 0:
            self._store.request_stop()
        return bool(votes > 0)

    def digest(self) -> str:
        """A fingerprint of the synchronized parameters (the same on every machine)."""
        return hashlib.sha256(np.ascontiguousarray(self._last).tobytes()).hexdigest()[:16]
