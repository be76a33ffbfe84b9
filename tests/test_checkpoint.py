"""Checkpointer: a damaged checkpoint falls back to the one before it; a failed save says so."""

import logging
import os

import pytest
import tensorflow as tf

from tfaccel.checkpoint import Checkpointer


def saver_at(directory, value):
    """A Checkpointer of one variable holding `value`."""
    variable = tf.Variable(float(value))
    return Checkpointer(str(directory), keep=3, state=tf.train.Checkpoint(v=variable)), variable


def save_three(directory):
    saver, variable = saver_at(directory, 0)
    for number in (100, 200, 300):
        variable.assign(float(number))
        saver.save(number)


def damage(directory, number):
    """Overwrites the data of checkpoint `number` with garbage of the same size."""
    (data,) = [name for name in os.listdir(directory) if name.startswith(f"ckpt-{number}.data")]
    path = os.path.join(directory, data)
    size = os.path.getsize(path)
    with open(path, "wb") as handle:
        handle.write(b"\xff" * size)
    with open(os.path.join(directory, f"ckpt-{number}.index"), "r+b") as handle:
        handle.truncate(10)


def test_restores_the_newest_checkpoint(tmp_path):
    save_three(tmp_path)
    saver, variable = saver_at(tmp_path, -1)
    assert saver.restore().endswith("ckpt-300") and variable.numpy() == 300.0
    assert saver.skipped == []


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    save_three(tmp_path)
    damage(tmp_path, 300)
    saver, variable = saver_at(tmp_path, -1)
    assert saver.restore().endswith("ckpt-200")
    assert variable.numpy() == 200.0
    assert [os.path.basename(path) for path, _ in saver.skipped] == ["ckpt-300"]


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
    save_three(tmp_path)
    for number in (100, 200, 300):
        damage(tmp_path, number)
    saver, _ = saver_at(tmp_path, -1)
    with pytest.raises(ValueError, match="no checkpoint in .* can be restored .*ckpt-300"):
        saver.restore()


def test_a_damaged_checkpoint_list_is_rebuilt_from_the_files(tmp_path, caplog):
    save_three(tmp_path)
    (tmp_path / "checkpoint").write_bytes(b"\x00not a text proto {{{")
    with caplog.at_level(logging.WARNING):
        saver, variable = saver_at(tmp_path, -1)
    assert saver.restore().endswith("ckpt-300") and variable.numpy() == 300.0
    # TensorFlow's two warnings about the list (a ParseError) said nothing the user can act on
    assert not [r for r in caplog.records if "ParseError" in r.getMessage()], caplog.text
    # The resumed run's saves still prune the checkpoints the lost list named (they were
    # orphaned, never removed), and a damaged newest one still falls back to those before it.
    for number in (400, 500):
        variable.assign(float(number))
        saver.save(number)
    indexes = sorted(name for name in os.listdir(tmp_path) if name.endswith(".index"))
    assert indexes == ["ckpt-300.index", "ckpt-400.index", "ckpt-500.index"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(("ckpt-100", "ckpt-200"))]
    damage(tmp_path, 500)
    again, restored = saver_at(tmp_path, -1)
    assert again.restore().endswith("ckpt-400") and restored.numpy() == 400.0


def test_a_failed_save_names_the_surviving_checkpoint(tmp_path, monkeypatch):
    save_three(tmp_path)
    saver, _ = saver_at(tmp_path, 400)

    def full_disk(**kwargs):
        with open(tmp_path / "ckpt-400.data-00000-of-00001", "wb") as handle:
            handle.write(b"partial")
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(saver.manager, "save", full_disk)
    with pytest.raises(ValueError, match="cannot write checkpoint ckpt-400 .* No space left") as e:
        saver.save(400)
    assert "the previous checkpoint ckpt-300 is intact" in str(e.value)
    assert not [name for name in os.listdir(tmp_path) if name.startswith("ckpt-400")]
    restored, variable = saver_at(tmp_path, -1)
    assert restored.restore().endswith("ckpt-300") and variable.numpy() == 300.0


def test_files_of_a_save_killed_midway_are_removed_and_then_replaced(tmp_path):
    save_three(tmp_path)
    # A SIGKILL while TensorFlow wrote ckpt-400: its temp directory and data, no index, unlisted.
    (tmp_path / "ckpt-400_temp").mkdir()
    (tmp_path / "ckpt-400_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    (tmp_path / "ckpt-400.data-00000-of-00001").write_bytes(b"half")
    saver, variable = saver_at(tmp_path, -1)
    assert saver.restore().endswith("ckpt-300") and variable.numpy() == 300.0
    assert saver.skipped == []
    assert sorted(name for name in os.listdir(tmp_path) if "400" in name) == []
    variable.assign(400.0)
    saver.save(400)  # the resumed run writes that checkpoint again, whole
    again, restored = saver_at(tmp_path, -1)
    assert again.restore().endswith("ckpt-400") and restored.numpy() == 400.0


def test_a_data_file_cut_short_falls_back_to_the_one_before(tmp_path):
    """An interrupted copy or a lost block: the index is whole, the data file half there. The
    restore raised IndexError ("Read less bytes than requested") and never fell back."""
    weights = tf.Variable(tf.zeros([4096]))
    saver = Checkpointer(str(tmp_path), keep=3, state=tf.train.Checkpoint(w=weights))
    for number in (100, 200):
        weights.assign(tf.fill([4096], float(number)))
        saver.save(number)
    (data,) = [name for name in os.listdir(tmp_path) if name.startswith("ckpt-200.data")]
    os.truncate(tmp_path / data, os.path.getsize(tmp_path / data) // 2)
    fresh = tf.Variable(tf.zeros([4096]))
    again = Checkpointer(str(tmp_path), keep=3, state=tf.train.Checkpoint(w=fresh))
    assert again.restore().endswith("ckpt-100")
    assert float(fresh.numpy().min()) == float(fresh.numpy().max()) == 100.0
    ((path, reason),) = again.skipped
    assert path.endswith("ckpt-200") and reason
