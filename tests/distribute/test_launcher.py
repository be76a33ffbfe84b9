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
        self.flushes = 0

    def flush(self):
        self.flushes += 1


def test_a_stopped_learner_of_several_machines_settles_once_then_waits_for_the_last_round(
    monkeypatch,
):
    """It tells the launcher its last change is in (once, at its first save after the stop),
    saves without waiting, then waits for the last round: True when the round came, False
    when it is overdue or the launcher is gone (the checkpoint saved stays)."""
    import threading

    from tfaccel.distribute import asynchronous, strategies
    from tfaccel.distribute.param_store import ParameterStore

    team = asynchronous.AsyncTeam(0, 1, 1, "unused", 1, machines=2)
    team.store = store = ParameterStore.create(4)
    try:
        agent = Flushed()
        team.before_save(agent)  # a periodic save: nothing to tell
        assert store.settled == 0 and not team.last_round()
        assert team.stop(True)
        team.before_save(agent)
        team.before_save(agent)
        assert store.settled == 1 and agent.flushes == 3
        threading.Timer(0.3, store.set_final).start()
        assert team.last_round()  # the learner saves again
        assert not team.last_round()  # once
        # Overdue: the launcher's round never came within four collective timeouts.
        team = asynchronous.AsyncTeam(0, 1, 1, "unused", 1, machines=2)
        team.store = late = ParameterStore.create(4)
        monkeypatch.setattr(strategies, "collective_timeout", lambda: 0.1)
        team.stop(True)
        team.before_save(agent)
        assert not team.last_round() and late.settled == 1
        late.close(unlink=True)
        # One machine: nothing to tell, nothing to wait for.
        alone = asynchronous.AsyncTeam(0, 1, 1, "unused", 1)
        alone.store = store
        alone.stop(True)
        alone.before_save(agent)
        assert store.settled == 1 and not alone.last_round()
    finally:
        store.close(unlink=True)
