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
