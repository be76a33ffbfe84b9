"""The replay memory saved with a checkpoint and restored from it (`tfaccel.replay_files`)."""

import os

import numpy as np
import pytest

from tests.fakes import Log
from tests.test_replay import B, drive
from tfaccel import replay_files
from tfaccel.replay import ReplayBuffer


def test_a_replay_that_cannot_be_written_leaves_no_part_and_says_so(tmp_path, monkeypatch):
    buffer = ReplayBuffer(B, 12 * B, (4, 3), seed=1)
    drive(buffer, 8, seed=0)
    (tmp_path / "replay-100.npz").write_bytes(b"the replay of the checkpoint before")

    def full_disk(path, **arrays):
        with open(path, "wb") as handle:
            handle.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    log = Log()
    assert not replay_files.save(str(tmp_path), 200, [buffer], log)
    assert sorted(os.listdir(tmp_path)) == ["replay-100.npz"]  # kept: its checkpoint may be
    assert "not saved with ckpt-200 ([Errno 28] No space left on device)" in log.messages[0]


def test_a_replay_file_is_restored_block_by_block_and_a_cut_one_is_named(tmp_path, monkeypatch):
    groups = [ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=True, seed=g) for g in (1, 2)]
    for g, buffer in enumerate(groups):
        drive(buffer, 30, seed=g)  # wrapped: all 12 rows of the ring
    assert replay_files.save(str(tmp_path), 30, groups, log=None)
    monkeypatch.setattr(ReplayBuffer, "_LOAD_ROWS", 5)  # rows 0-4, 5-9, 10-11 of each group
    restored = [ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=True) for _ in groups]
    assert replay_files.restore(str(tmp_path), str(tmp_path / "ckpt-30"), restored)
    for buffer, again in zip(groups, restored, strict=True):
        for name, value in buffer.state_dict().items():
            np.testing.assert_array_equal(again.state_dict()[name], value, err_msg=name)
    assert not replay_files.restore(str(tmp_path), str(tmp_path / "ckpt-40"), restored)

    path = tmp_path / "replay-30.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="cannot restore the replay memory from .*replay-30.npz"):
        replay_files.restore(str(tmp_path), str(tmp_path / "ckpt-30"), restored)


# ----------------------------------------------------------------------------- Prefetcher
