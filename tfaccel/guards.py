"""What watches over a run and says what went wrong: stop requests (SIGINT, SIGTERM), the
guard against non-finite updates, the watch for a network whose output no longer depends on its
input, and the env pool's faults.
"""

from __future__ import annotations

import contextlib
import os
import signal


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks, so a stop always saves first;
    `on_signal(number)`, if given, also runs at each signal (the asynchronous launcher forwards
    it).

    A process that must not die of a signal before its loop starts (a learner of an
    asynchronous run, stopped while it starts up) calls `StopRequest.hold_early()` first: a signal
    until then is kept, and the first `StopRequest` entered takes it over (the loop then saves
    after its first update and stops).
    """

    _early: str | None = None
    entered = False  # whether this process has entered one: its loop (or launcher) took over

    def __init__(self, on_signal=None):
        self.signal_name = None
        self._on_signal = on_signal
        self._previous = {}

    @classmethod
    def hold_early(cls) -> None:
        def keep(number, frame):
            cls._early = signal.Signals(number).name

        for sig in (signal.SIGINT, signal.SIGTERM):
            if not inherited_ignore(sig):
                signal.signal(sig, keep)
        # Started with them blocked (`pool.signals_blocked_while_starting`): one that came
        # meanwhile is pending, and kept now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    @classmethod
    def early_signal(cls) -> str | None:
        """The signal held since `hold_early`, if one came."""
        return cls._early

    def __enter__(self):
        StopRequest.entered = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            if not inherited_ignore(sig):
                self._previous[sig] = signal.signal(sig, self._handle)
        self.signal_name, StopRequest._early = StopRequest._early, None
        return self

    def _handle(self, number, frame):
        self.signal_name = signal.Signals(number).name
        if self._on_signal is not None:
            self._on_signal(number)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def inherited_ignore(sig: int) -> bool:
    """Whether `sig` is SIGINT and ignored: a process started from a script with `cmd &` (as
    POSIX shells start background jobs; the learners of such a launcher inherit it) keeps
    ignoring Ctrl-C, as it does while the run starts. SIGTERM is always taken: a scheduler
    that sends it expects a save before its SIGKILL."""
    return sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN


@contextlib.contextmanager
def saved_on(error_type, save):
    """Calls `save` when the block raises `error_type` (the pool gave up on a worker: the
    learner's state is sound, so the run keeps its progress), then lets the error go on."""
    try:
        yield
    except error_type:
        save()
        raise


def report_faults(pool, log) -> None:
    """Says what went wrong with env workers since the last call (the pool replaced them)."""
    for fault in pool.drain_faults():
        log.message(f"warning: {fault}")


class NonFiniteGuard:
    """What a run does after an SGD step whose loss or gradient was not finite (the learner
    never applies one; see `Learner.train`): it says where the value appeared and, by `action`:

    - `skip`: goes on with the next batch;
    - `restore`: reloads the weights and optimizer state of the last checkpoint (keeping the
      optimizer's step count: the learning rate's schedule goes on), then goes on; `team` then
      shares the restored weights (an asynchronous run's parameter store takes them);
    - `stop`: ends the run with that message (a `ValueError`); the last checkpoint stays.

    `check` replaces the update's `skipped_updates` by the count of this process so far.
    """

    ACTIONS = ("skip", "restore", "stop")

    @classmethod
    def check_action(cls, action: str) -> None:
        if action not in cls.ACTIONS:
            raise ValueError(f"on_nonfinite must be one of {cls.ACTIONS}, got {action!r}")

    def __init__(self, action: str, agent, saver, log, team=None):
        self.check_action(action)
        self.action, self._agent, self._saver, self._log = action, agent, saver, log
        self._team = team
        self.skipped = 0

    def check(self, metrics: dict, frames: int) -> None:
        count = int(metrics.get("skipped_updates", 0))
        self.skipped += count
        metrics["skipped_updates"] = self.skipped
        if not count:
            return
        where = getattr(self._agent, "last_fault", "") or "an update"
        text = f"a non-finite value in {where} at {frames:,} frames: {count} SGD step(s) skipped"
        if self.action == "stop":
            raise ValueError(
                f"{text}; stopping (on_nonfinite = 'stop'), the last checkpoint is intact"
            )
        if self.action == "restore":
            iterations = self._agent.optimizer.iterations
            steps = int(iterations)
            path = self._saver.restore_only("network", "target", "optimizer")
            iterations.assign(steps)
            if path and self._team is not None:
                self._team.after_restore(self._agent)
            text += f"; weights restored from {os.path.basename(path)}" if path else ""
        self._log.message(f"warning: {text}")


class DeadNetworkWatch:
    """Warns when the network's output stops depending on its input, from the spread over an
    update's batch (`value_std` of the A2C and PPO losses, `q_std` of the DQN loss):

    - dead: below `SPREAD` for `patience` updates in a row. The ReLU units of some layer are
      negative on every input (seen on Pong in A3C runs: every unit of the first convolution):
      no gradient reaches them again, so the run no longer learns, and resuming continues it.
    - nearly flat: below `WEAK` for `weak_frames` env frames in a row. A2C's critic on Breakout
      with centered frames stayed at a spread of about 0.005 (explained variance 0) for 10M
      frames and never learned; on Pong without an offset, where most first-layer channels died,
      it stayed under 0.02 for the first million frames. A learning critic's spread passes 0.1
      within a few hundred thousand frames (docs/notes/first-layers.md).
    """

    KEYS = ("value_std", "q_std")
    SPREAD = 1e-6
    WEAK = 0.01

    def __init__(self, log, patience: int = 50, weak_frames: int = 1_000_000):
        self._log, self._patience, self._weak_frames = log, patience, weak_frames
        self._run, self._since, self._weak_since = 0, 0, None
        self.warned = self.warned_weak = False

    def check(self, metrics: dict, frames: int) -> None:
        spread = next((metrics[key] for key in self.KEYS if key in metrics), None)
        if spread is None:
            return
        self._weak_since = (self._weak_since or frames) if spread < self.WEAK else None
        if (
            not self.warned_weak
            and self._weak_since is not None
            and frames - self._weak_since >= self._weak_frames
        ):
            self.warned_weak = True
            self._log.message(
                f"warning: the network's output has hardly depended on its input since "
                f"{self._weak_since:,} frames (a spread under {self.WEAK} over each batch): its "
                "first layers may be dead or saturated, and it may not learn; see "
                "docs/notes/first-layers.md"
            )
        if self.warned:
            return
        self._since = self._since if self._run else frames
        self._run = self._run + 1 if spread < self.SPREAD else 0
        if self._run >= self._patience:
            self.warned = True
            self._log.message(
                f"warning: the network's output has been the same for every observation of the "
                f"batch for {self._run} updates, since {self._since:,} frames: its ReLU units "
                "have died and it will not learn again (resuming continues it); stop the run and "
                "start it anew with a lower learning rate or another seed"
            )
