"""The replay memory in a run's checkpoints: one file, `replay-<frames>.npz`, beside the
checkpoint `ckpt-<frames>` it was saved with (only the latest is kept: at 1M transitions it is
8.3 GB). The file is written atomically and read block by block, so a restore holds one block of
frames in memory beside the buffers; it is never unpickled.

    saved = replay_files.save(checkpoint_dir, frames, replays, log)  # before the checkpoint
    ...
    if saved: replay_files.prune(checkpoint_dir, frames)              # after it
    replay_files.restore(checkpoint_dir, "…/ckpt-<frames>", replays)  # False: none saved
"""

from __future__ import annotations

import glob
import os
import re
import zipfile

import numpy as np


def path(directory: str, frames: int) -> str:
    """The replay file saved with checkpoint `ckpt-<frames>` in `directory`."""
    return os.path.join(directory, f"replay-{frames}.npz")


def save(directory: str, frames: int, replays, log) -> bool:
    """Writes every group's replay state to `replay-{frames}.npz`, atomically; True if it did.

    A write that fails (a full disk, say) leaves no partial file and does not stop the run: the
    checkpoint is still saved, and a resume from it refills the replay.
    """
    os.makedirs(directory, exist_ok=True)
    arrays = {
        f"group{g}/{name}": value
        for g, replay in enumerate(replays)
        for name, value in replay.state_dict().items()
    }
    temporary = path(directory, frames) + ".partial.npz"
    try:
        np.savez(temporary, **arrays)
        os.replace(temporary, path(directory, frames))
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        log.message(
            f"warning: the replay memory was not saved with ckpt-{frames} ({error}); a resume "
            "from that checkpoint refills the replay"
        )
        return False
    return True


def prune(directory: str, frames: int) -> None:
    """Removes replay files of older checkpoints, and parts of cut saves (the memory is large:
    one file is kept)."""
    keep = path(directory, frames)
    for file in glob.glob(os.path.join(directory, "replay-*.npz")):
        if file != keep:
            os.remove(file)


def restore(directory: str, checkpoint_path: str, replays) -> bool:
    """Loads the replay saved with `checkpoint_path` (`.../ckpt-N`); False if there is none.

    Raises:
        ValueError: the file is unreadable or does not fit these buffers.
    """
    match = re.search(r"ckpt-(\d+)$", checkpoint_path)
    file = match and path(directory, int(match.group(1)))
    if not file or not os.path.exists(file):
        return False
    try:
        with np.load(file, allow_pickle=False) as archive:  # never unpickle a file
            for g, replay in enumerate(replays):
                prefix = f"group{g}/"
                state = {
                    k[len(prefix) :]: archive[k]
                    for k in archive.files
                    if k.startswith(prefix) and k != prefix + "frames"
                }
                with _StoredRows(archive.zip, prefix + "frames.npy") as frames:
                    replay.load_state_dict(dict(state, frames=frames))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"cannot restore the replay memory from {file} ({error}); delete the file to refill "
            "the replay instead, or set train_off_policy.checkpoint_replay = False"
        ) from error
    return True


class _StoredRows:
    """An array of an `.npz` file (as `np.savez` writes them: stored, not compressed) read block
    by block as its row slices are asked for, in order, so only one block is in memory."""

    def __init__(self, archive: zipfile.ZipFile, member: str):
        self._stream = archive.open(member)
        version = np.lib.format.read_magic(self._stream)
        if version == (1, 0):
            self.shape, fortran, self.dtype = np.lib.format.read_array_header_1_0(self._stream)
        else:
            self.shape, fortran, self.dtype = np.lib.format.read_array_header_2_0(self._stream)
        if fortran or self.dtype.hasobject:
            raise ValueError(f"{member}: not an array of plain values in C order")
        self._next = 0

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.shape[0])
        if start != self._next or step != 1:
            raise ValueError(f"rows {start}:{stop} asked for, but the next ones are {self._next}:")
        block = np.empty((stop - start, *self.shape[1:]), self.dtype)
        view, done = memoryview(block).cast("B"), 0
        while done < block.nbytes:
            count = self._stream.readinto(view[done:])
            if not count:
                raise EOFError(f"the file ends before row {stop} of {self.shape[0]}")
            done += count
        self._next = stop
        return block

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._stream.close()
