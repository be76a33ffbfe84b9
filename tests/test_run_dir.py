"""Resuming a run directory: its settings read as text, and what changed since."""

from tests.fakes import Log
from tfaccel import run_dir

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
    settings = run_dir.gin_settings(BEFORE)
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
    assert run_dir.changed_settings(BEFORE, after) == [
        "eval/train.eval_epsilon: 0.001 -> unset",
        "nature_torso.center_frames: False -> True",
        "train_off_policy.torso: '@nature_torso' -> '@nature_torso()'",
        "train_off_policy.total_frames: unset -> 20000000",
    ]
    assert run_dir.changed_settings(BEFORE, BEFORE + "\n# a comment\n") == []


def test_a_resume_keeps_the_previous_settings_and_warns_only_when_they_changed(tmp_path):
    path = tmp_path / "operative_config.gin"
    log = Log()
    path.write_text(BEFORE)
    run_dir.note_changed_settings(str(path), BEFORE, 4000, log)
    assert log.messages == [] and path.read_text() == BEFORE  # the same settings: nothing to say
    run_dir.note_changed_settings(str(path), BEFORE.replace("0.00071", "0.0005"), 4000, log)
    assert not path.exists() and (tmp_path / "operative_config.4000.gin").read_text() == BEFORE
    assert log.messages[0].endswith("train_off_policy.learning_rate: 0.00071 -> 0.0005")
    path.write_text("train_off_policy.learning_rate = (")  # cut off mid-value
    run_dir.note_changed_settings(str(path), BEFORE, 8000, log)
    assert "are not readable gin" in log.messages[1]
    assert (tmp_path / "operative_config.8000.gin").exists()
    second = BEFORE.replace("0.00071", "0.0005")  # resumed at 4000 frames again, then changed
    path.write_text(second)
    run_dir.note_changed_settings(str(path), BEFORE.replace("False", "True"), 4000, log)
    assert (tmp_path / "operative_config.4000.gin").read_text() == BEFORE  # the first, kept
    assert (tmp_path / "operative_config.4000-2.gin").read_text() == second
    assert "operative_config.4000-2.gin" in log.messages[2]
