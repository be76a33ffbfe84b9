"""The learner's report to the launcher when it fails (in this process, with a stand-in trainer)."""

import multiprocessing
import re
import signal
import types

import pytest

from tfaccel import launcher, on_policy


class Store:
    def close(self, unlink):
        pass


@pytest.mark.parametrize("joined_the_store", [False, True])
def test_a_learners_value_error_is_a_rejected_setting_only_before_it_joined_the_store(
    tmp_path, monkeypatch, joined_the_store
):
    def train(root_dir, team):
        if joined_the_store:
            team.store = Store()  # as `AsyncTeam.attach` leaves it: the run has begun
        raise ValueError("no such thing\nmore")

    monkeypatch.setattr(on_policy, "train", train)
    monkeypatch.setattr(launcher, "_stop_when_orphaned", lambda parent: None)  # no watch thread
    receive, send = multiprocessing.Pipe(duplex=False)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as ended:  # status 1, no traceback: the line says it
            launcher._learner_main("", str(tmp_path), (1, 2, 1, "unused", 1), send, {})
        assert ended.value.code == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    # Rejected before it trained: the same command fails again. Later: it resumes.
    report = receive.recv()
    assert report == {"error": "no such thing", "setting": not joined_the_store, "env": False}
    failed = "failed: no such thing; the others were stopped"
    then = "" if not joined_the_store else " (a running learner saves a checkpoint first): the same"
    with pytest.raises(launcher.LearnerFailed, match=re.escape(failed + then)):
        launcher._outcome(types.SimpleNamespace(signal_name=None), (1, 1), {1: report}, None)


def test_a_killed_learner_is_named_by_its_signal_and_a_stopped_one_stops_the_run():
    """`exit code -9` became `killed by SIGKILL`; a SIGTERM to one learner ended the run as
    finished (status 0, no signal in its summary)."""
    running = types.SimpleNamespace(signal_name=None)
    with pytest.raises(launcher.LearnerFailed, match="learner 1 of the asynchronous run failed: "
                       "killed by SIGKILL; the others were stopped"):  # fmt: skip
        launcher._outcome(running, (1, -signal.SIGKILL), {0: {"stopped_by": "SIGTERM"}}, None)
    summaries = {0: {"stopped_by": "another process"}, 1: {"stopped_by": "SIGTERM"}}
    assert launcher._outcome(running, None, summaries, None)["stopped_by"] == "SIGTERM"
    finished = {0: {"stopped_by": None}, 1: {"stopped_by": None}}
    assert launcher._outcome(running, None, finished, None)["stopped_by"] is None


def test_a_learners_failing_env_is_to_be_fixed_before_the_same_command_resumes():
    report = {"error": "worker 0 failed: env 3 returned ...", "setting": False, "env": True}
    with pytest.raises(launcher.LearnerFailed, match=r"checkpoint first\): fix the env, then the "
                       r"same command resumes"):  # fmt: skip
        launcher._outcome(types.SimpleNamespace(signal_name=None), (1, 1), {1: report}, None)


class Flushed:
    """A learner's StoreSync as `AsyncTeam.before_save` uses it."""

    def __init__(self):
        self.flushes = self.pulls = 0

    def flush(self):
        self.flushes += 1

    def pull(self):
        self.pulls += 1


def test_the_stops_save_of_a_learner_of_several_machines_waits_briefly_for_the_last_round(
    monkeypatch,
):
    """It tells the launcher its last change is in (once), then waits for the machines' last
    round before it saves, and takes its parameters; a round overdue (or a launcher gone), and
    it saves what its store holds. A periodic save, or a run on one machine, does not wait."""
    import threading
    import time

    from tfaccel.distribute import asynchronous
    from tfaccel.distribute.param_store import ParameterStore

    stores = [ParameterStore.create(4) for _ in range(3)]
    try:
        team = asynchronous.AsyncTeam(0, 1, 1, "unused", 1, machines=2)
        team.store, agent = stores[0], Flushed()
        team.before_save(agent)  # a periodic save
        assert stores[0].settled == 0 and (agent.flushes, agent.pulls) == (1, 0)
        assert team.stop(True)
        threading.Timer(0.3, stores[0].set_final).start()
        started = time.monotonic()
        team.before_save(agent)
        assert time.monotonic() - started >= 0.25  # it waited for the round
        assert stores[0].settled == 1 and (agent.flushes, agent.pulls) == (2, 1)
        team.before_save(agent)  # once
        assert stores[0].settled == 1 and agent.flushes == 3
        # Overdue: it saves after the launcher's wait and a margin.
        monkeypatch.setattr(asynchronous, "settle_seconds", lambda: -4.8)
        late = asynchronous.AsyncTeam(0, 1, 1, "unused", 1, machines=2)
        late.store, agent = stores[1], Flushed()
        late.stop(True)
        late.before_save(agent)
        assert stores[1].settled == 1 and not stores[1].final and agent.pulls == 0
        # One machine: nothing to tell, nothing to wait for.
        alone = asynchronous.AsyncTeam(0, 1, 1, "unused", 1)
        alone.store = stores[2]
        alone.stop(True)
        alone.before_save(agent)
        assert stores[2].settled == 0
    finally:
        for store in stores:
            store.close(unlink=True)
