"""Asynchronous training inside a machine: what a learner process holds around the parameter
store.

Stooke & Abbeel (2018), section 3.2, and Distributed BA3C (Adamski et al., 2018): each learner
process has its own envs, sampler and device; it pulls the current parameters from the central
store (`param_store.ParameterStore`), takes `steps_per_push` local updates with its own Adam
moments, and pushes their change (`param_store.AsyncAdam` defines the rule; with one learner it
is exactly Adam). Nobody waits for anybody: a learner's change lands on parameters the others
moved meanwhile. `StoreSync` is that pull and push around a learner; `AsyncTeam` tells the
on-policy trainer where a learner writes, its seed, every learner's agent steps and when all
stop. `tfaccel.launcher.train_async` starts and supervises the learner processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from tfaccel.distribute.machines import settle_seconds
from tfaccel.distribute.param_store import ParameterStore
from tfaccel.guards import StopRequest


class StoreSync:
    """Wraps a `Learner`: pull before each round of `steps_per_push` updates, push after it.

    Everything else (network, optimizer, generator, learning_rate) is the learner's.
    """

    def __init__(self, agent, steps_per_push: int):
        self._agent, self._store, self._steps_per_push = agent, None, int(steps_per_push)
        variables = agent.network.trainable_variables
        sizes = [int(np.prod(v.shape)) for v in variables]
        self.size = sum(sizes)  # parameters in the store

        @tf.function(autograph=False)
        def read():
            return tf.concat([tf.reshape(v, [-1]) for v in variables], axis=0)

        @tf.function(autograph=False)
        def write(flat):
            for variable, piece in zip(variables, tf.split(flat, sizes), strict=True):
                variable.assign(tf.reshape(piece, variable.shape))

        self.read, self._write = (lambda: read().numpy()), write
        self._start = None
        self._since_pull = 0

    def __getattr__(self, name):
        return getattr(self._agent, name)

    def connect(self, store: ParameterStore) -> None:
        """Trains through `store` from now on; the network takes its parameters at once, so
        acting starts from the shared parameters too."""
        self._store, self._since_pull = store, 0
        self.pull()

    def pull(self) -> None:
        """Copies the store's parameters into the network (and notes them as the start of a round)."""
        self._start = self._store.pull()
        self._write(self._start)

    def flush(self) -> None:
        """Pushes the change of a round in progress, then pulls: the network holds the store's
        parameters (the next update starts a new round)."""
        if self._since_pull:
            self._store.push(self.read() - self._start)
            self._since_pull = 0
        self.pull()

    def reset_store(self) -> None:
        """Sets the store to the network's parameters (the others' pushes since are dropped)."""
        self._store.set(self.read())
        self._since_pull = 0

    def train(self, batch) -> dict:
        """One local update; every `steps_per_push` of them, pushes their change to the store."""
        if self._since_pull == 0:
            self.pull()
        metrics = self._agent.train(batch)
        self._since_pull += 1
        if self._since_pull == self._steps_per_push:
            self._store.push(self.read() - self._start)
            self._since_pull = 0
        return metrics


class AsyncTeam:
    """This learner's place among the K learners of an asynchronous run (see the module doc).

    The runner asks it where to write, which seed to use, how many agent steps all learners have
    taken, and whether to stop; `attach` wraps the runner's learner in a `StoreSync`.
    """

    def __init__(
        self, index: int, size: int, steps_per_push: int, store_name: str, chunks: int,
        operative_config: str = "", machine: int = 0, machines: int = 1,
    ):  # fmt: skip
        self.index, self.size, self.chief, self.machine = index, size, index == 0, machine
        self.learners = size * machines  # of the whole run: they share its frames
        self._machines, self._stopping, self._settled = machines, False, False
        self.operative_config = operative_config  # the launcher's settings, for the run dir
        self._steps_per_push, self._store_name, self._chunks = steps_per_push, store_name, chunks
        self.store, self._reported = None, 0

    def run_dir(self, root_dir: str) -> str:
        """Where this learner writes: `root_dir` for the chief, `root_dir/learner-<i>` otherwise."""
        return root_dir if self.chief else os.path.join(root_dir, f"learner-{self.index}")

    def seed(self, seed: int) -> int:
        """This learner's seed: distinct for every learner of every machine."""
        return seed + 100_003 * (self.index + self.size * self.machine)

    def attach(self, agent, counters):
        """Connects the learner to the store; the chief creates it from its own weights."""
        sync = StoreSync(agent, self._steps_per_push)
        if self.chief:  # filled under a temporary name, then published whole
            name = self._store_name
            self.store = ParameterStore.create(sync.size, self._chunks, name=f"{name}-new")
            self.store.set(sync.read())
            self.store.set_steps(int(counters.agent_steps))
            self.store.publish(name)
        else:
            deadline = time.monotonic() + 600
            while not ParameterStore.wait_for(self._store_name, timeout=0.5):
                if StopRequest.early_signal():  # before the store: nothing to save
                    sys.exit(0)
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "the chief learner did not create the parameter store in 600 s"
                    )
            self.store = ParameterStore.attach((self._store_name, sync.size, self._chunks))
        sync.connect(self.store)
        return sync

    def before_save(self, agent: StoreSync) -> None:
        """The checkpoint and the export hold the store's parameters (this learner's pending
        change pushed first), not this learner's copy of them.

        The stop's save in a run over several machines first tells the launcher that this
        learner's last change is in the store, and waits for the machines' last round
        (`launcher._wait_in_rounds`): every machine then saves the same parameters, those the
        launchers report. The wait is short and bounded (a job scheduler's SIGKILL follows its
        SIGTERM within 30 s or so): a round later than that, or a launcher gone, and the
        learner saves what its store holds."""
        agent.flush()
        if self._machines > 1 and self._stopping and not self._settled:
            self._settled = True  # once: a later save (none is due) does not wait again
            self.store.settle()
            deadline = time.monotonic() + settle_seconds() + 5.0
            while not (self.store.final or ORPHANED.is_set() or time.monotonic() > deadline):
                time.sleep(0.05)
            if self.store.final:
                agent.pull()

    def after_restore(self, agent: StoreSync) -> None:
        """The store takes the weights this learner restored (its last checkpoint, saved from
        the store): every learner goes on from them."""
        agent.reset_store()

    def agent_steps(self, base_steps: int, local_steps: int) -> int:
        """All learners' agent steps (this learner adds the steps it took since it last asked)."""
        del base_steps  # the store's counter started from the chief's restored count
        added, self._reported = local_steps - self._reported, local_steps
        return self.store.add_steps(added) + self.store.remote_steps

    def stop(self, flag: bool) -> bool:
        """True once this learner or any other asked to stop (`flag` asks)."""
        if flag:
            self.store.request_stop()
        self._stopping = bool(flag) or self.store.stop_requested
        return self._stopping

    def tell(self, log, line: str) -> None:
        """Writes `line` (why the run stopped) to this learner's log; the launcher speaks for
        the learners on the console."""
        log.message(line)

    def close(self) -> None:
        """Unmaps the store (the launcher removes it)."""
        if self.store is not None:
            self.store.close(unlink=self.chief and ORPHANED.is_set())


ORPHANED = threading.Event()  # this learner's launcher is gone
