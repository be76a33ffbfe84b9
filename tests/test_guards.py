"""The guards of a run: the dead-network watch."""

import os
import signal
import time

from tests.fakes import Log
from tfaccel import guards


def test_dead_network_watch_warns_once_after_patience_updates_without_spread():
    log = Log()
    watch = guards.DeadNetworkWatch(log, patience=3)
    for frames, spread in [(100, 0.2), (200, 0.0), (300, 0.0), (400, 0.3)]:  # a live network
        watch.check({"value_std": spread}, frames)
    assert log.messages == [] and not watch.warned
    for frames in (500, 600, 700, 800, 900):
        watch.check({"value_std": 1e-8}, frames)
    assert len(log.messages) == 1 and watch.warned
    assert log.messages[0].startswith("warning: the network's output has been the same")
    assert "for 3 updates, since 500 frames" in log.messages[0]


def test_dead_network_watch_reads_q_std_and_ignores_losses_without_a_spread():
    log = Log()
    watch = guards.DeadNetworkWatch(log, patience=2)
    watch.check({"loss": 0.0}, 100)
    watch.check({"loss": 0.0}, 200)
    assert log.messages == []
    watch.check({"q_std": 0.0}, 300)
    watch.check({"q_std": 0.0}, 400)
    assert len(log.messages) == 1 and "since 300 frames" in log.messages[0]


def test_dead_network_watch_warns_once_about_a_nearly_flat_output_for_a_million_frames():
    """A2C's critic on Breakout with centered frames: a spread of ~0.005 for 10M frames, above
    the dead threshold, and the run never learned; it said nothing."""
    log = Log()
    watch = guards.DeadNetworkWatch(log)
    for frames in range(0, 900_000, 10_000):
        watch.check({"value_std": 0.005}, frames)
    watch.check({"value_std": 0.3}, 900_000)  # a live batch: the count starts again
    for frames in range(910_000, 1_900_000, 10_000):
        watch.check({"value_std": 0.005}, frames)
    assert log.messages == []
    for frames in range(1_900_000, 3_000_000, 10_000):
        watch.check({"value_std": 0.005}, frames)
    assert len(log.messages) == 1 and watch.warned_weak and not watch.warned
    assert "hardly depended on its input since 910,000 frames" in log.messages[0]


def test_a_stop_request_turns_signals_into_a_flag_and_keeps_an_inherited_ignore():
    """Started with SIGINT ignored (`cmd &` in a script), a run ignored a Ctrl-C while it started
    up but stopped on one while it trained."""
    before, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with guards.StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.signal_name == "SIGINT"  # Python runs the handler before the next line
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with guards.StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.signal_name is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        # An async learner of such a launcher inherits the ignore: it holds early signals but
        # keeps ignoring SIGINT (it stopped the run while its launcher ignored it).
        guards.StopRequest.hold_early()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with guards.StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.signal_name is None
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, before_term)


def test_an_ignored_sigterm_is_still_taken_as_a_stop():
    """A scheduler's SIGTERM expects a save before its SIGKILL, whatever the process inherited."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with guards.StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signal_name == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
