import re
import types

import pytest

from tfaccel import runner


class Log:
    def __init__(self):
        self.messages = []

    def message(self, text):
        self.messages.append(text)


def test_dead_network_watch_warns_once_after_patience_updates_without_spread():
    log = Log()
    watch = runner.DeadNetworkWatch(log, patience=3)
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
    watch = runner.DeadNetworkWatch(log, patience=2)
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
    watch = runner.DeadNetworkWatch(log)
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


BEFORE = """
# Parameters for nature_torso:
nature_torso.center_frames = False
train_off_policy.torso = @nature_torso
train_off_policy.learning_rate = 0.00071
train_off_policy.schedule = [1, 2,
    3]
eval/train.eval_epsilon = 0.001
"""


def test_gin_settings_reads_scopes_references_and_values_spanning_lines():
    settings = runner.gin_settings(BEFORE)
    assert settings == {
        "nature_torso.center_frames": False,
        "train_off_policy.torso": "@nature_torso",
        "train_off_policy.learning_rate": 0.00071,
        "train_off_policy.schedule": [1, 2, 3],
        "eval/train.eval_epsilon": 0.001,
    }


def test_changed_settings_names_each_changed_added_and_dropped_binding():
    after = (
        BEFORE.replace("center_frames = False", "center_frames = True")
        .replace("eval/train.eval_epsilon = 0.001\n", "")
        .replace("@nature_torso", "@nature_torso()")
        + "train_off_policy.total_frames = 20_000_000\n"
    )
    assert runner.changed_settings(BEFORE, after) == [
        "eval/train.eval_epsilon: 0.001 -> unset",
        "nature_torso.center_frames: False -> True",
        "train_off_policy.torso: '@nature_torso' -> '@nature_torso()'",
        "train_off_policy.total_frames: unset -> 20000000",
    ]
    assert runner.changed_settings(BEFORE, BEFORE + "\n# a comment\n") == []


def test_a_resume_keeps_the_previous_settings_and_warns_only_when_they_changed(tmp_path):
    path = tmp_path / "operative_config.gin"
    log = Log()
    path.write_text(BEFORE)
    runner._note_changed_settings(str(path), BEFORE, 4000, log)
    assert log.messages == [] and path.read_text() == BEFORE  # the same settings: nothing to say
    runner._note_changed_settings(str(path), BEFORE.replace("0.00071", "0.0005"), 4000, log)
    assert not path.exists() and (tmp_path / "operative_config.4000.gin").read_text() == BEFORE
    assert log.messages[0].endswith("train_off_policy.learning_rate: 0.00071 -> 0.0005")
    path.write_text("train_off_policy.learning_rate = (")  # cut off mid-value
    runner._note_changed_settings(str(path), BEFORE, 8000, log)
    assert "are not readable gin" in log.messages[1]
    assert (tmp_path / "operative_config.8000.gin").exists()
    second = BEFORE.replace("0.00071", "0.0005")  # resumed at 4000 frames again, then changed
    path.write_text(second)
    runner._note_changed_settings(str(path), BEFORE.replace("False", "True"), 4000, log)
    assert (tmp_path / "operative_config.4000.gin").read_text() == BEFORE  # the first, kept
    assert (tmp_path / "operative_config.4000-2.gin").read_text() == second
    assert "operative_config.4000-2.gin" in log.messages[2]


@pytest.mark.parametrize(
    "horizon, epochs, minibatches, message",
    [
        (0, 1, 1, "horizon is 0; it must be 1 or more"),
        (5, 0, 1, "epochs is 0; it must be 1 or more"),
        (5, 1, 0, "minibatches is 0; it must be 1 or more"),
        (5, 4, 3, "a rollout of 40 samples per replica (horizon 5 x 8 envs) does not split into 3"),
    ],
)
def test_a_rollout_the_learner_cannot_use_whole_is_named(horizon, epochs, minibatches, message):
    algorithm = types.SimpleNamespace(epochs=epochs, minibatches=minibatches)
    with pytest.raises(ValueError, match=re.escape(message)):
        runner._check_rollout(horizon, 8, algorithm)
    runner._check_rollout(5, 8, types.SimpleNamespace(epochs=4, minibatches=4))  # 40 = 4 x 10
