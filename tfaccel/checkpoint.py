"""Resume state: everything needed to continue a run, in a TensorFlow checkpoint.

Networks, optimizer slots, counters and the policy's random generator are TensorFlow objects, so
one `tf.train.Checkpoint` holds them and nothing is pickled. `CheckpointManager` keeps the last few
and lists a checkpoint only once all its files are written, so a crash while saving leaves the
previous list intact. A listed checkpoint that cannot be read (a damaged file, a lost disk block)
is skipped with a warning for the one before it; a save that fails (a full disk, a quota) raises a
`ValueError` that says the previous checkpoint survives.
"""

from __future__ import annotations

import glob
import os
import re
import shutil

import tensorflow as tf
from absl import logging

from tfaccel.console import io_failure


class Counters(tf.Module):
    """Run counters that must survive a restart, and the last `RECENT` game scores (so the
    reported mean of the last games continues across a resume)."""

    RECENT = 20

    def __init__(self):
        super().__init__(name="counters")
        self.agent_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="agent_steps")
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.games = tf.Variable(0, dtype=tf.int64, trainable=False, name="games")
        self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="wall_seconds")
        self.recent_scores = tf.Variable(
            tf.zeros([self.RECENT], tf.float64), trainable=False, name="recent_scores"
        )
        self.recent_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="recent_count")

    def remember_scores(self, scores) -> None:
        """Keeps the last `RECENT` of `scores` (oldest first)."""
        scores = list(scores)[-self.RECENT :]
        padded = scores + [0.0] * (self.RECENT - len(scores))
        self.recent_scores.assign(tf.constant(padded, tf.float64))
        self.recent_count.assign(len(scores))

    def recalled_scores(self) -> list[float]:
        """The remembered scores, oldest first."""
        return [float(s) for s in self.recent_scores.numpy()[: int(self.recent_count)]]


class Checkpointer:
    """Saves and restores `trackables` under `directory`, keeping the last `keep`.

    After `restore`, `skipped` lists (path, reason) of newer checkpoints that could not be read.
    """

    def __init__(self, directory: str, keep: int = 3, **trackables):
        self.directory, self._trackables = directory, trackables
        self.checkpoint = tf.train.Checkpoint(**trackables)
        # A damaged `checkpoint` index file: TensorFlow warns twice (a ParseError); `restore`
        # finds the checkpoints by their files, and the next save writes the index anew.
        tf_logger = tf.get_logger()
        level = tf_logger.level
        tf_logger.setLevel("ERROR")
        try:
            self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)
        finally:
            tf_logger.setLevel(level)
        self._keep = keep
        self.skipped: list[tuple[str, str]] = []

    def restore(self) -> str | None:
        """Restores the newest readable checkpoint if there is one; returns its path.

        Objects the program gained since the checkpoint was written (a new counter, say) keep
        their initial values, with a warning naming them.

        Raises:
            ValueError: there are checkpoints, but none can be read, or they belong to another
                program (they match none of its objects).
        """
        self.skipped = []
        _remove_unfinished(self.directory)
        # The checkpoints are found by their index files, not by TensorFlow's list file, which
        # a damaged or lost copy leaves empty or short (it would start afresh over them).
        listed = _found(self.directory)
        for path in reversed(listed):
            try:
                status = self.checkpoint.restore(path)
                status.assert_nontrivial_match()
            except (tf.errors.OpError, ValueError, AssertionError, IndexError) as error:
                # IndexError: a data file cut short ("Read less bytes than requested")
                self.skipped.append((path, io_failure(error)))
                continue
            try:
                status.assert_existing_objects_matched()
            except AssertionError as error:
                logging.warning("%s: restored partially: %s", path, io_failure(error))
            return path
        if self.skipped:
            _silence_unrestored_warnings()  # the failed attempts' objects, at their deletion
            names = ", ".join(os.path.basename(path) for path, _ in self.skipped)
            raise ValueError(
                f"no checkpoint in {self.directory} can be restored ({names}; the newest: "
                f"{self.skipped[0][1]}): move the directory away to start afresh"
            )
        return None

    def restore_only(self, *names: str) -> str | None:
        """Restores just the objects called `names` (those it has) from the latest checkpoint,
        leaving the others (the counters, say) as they are; returns its path, or None."""
        path = self.manager.latest_checkpoint
        if path:
            chosen = {name: self._trackables[name] for name in names if name in self._trackables}
            tf.train.Checkpoint(**chosen).restore(path).expect_partial()
        return path

    def save(self, number: int) -> str:
        """Writes checkpoint `number` and returns its name (`ckpt-<number>`).

        Raises:
            ValueError: it could not be written (a full disk, say); its partial files are
                removed and the previous checkpoint is still the one a resume restores.
        """
        try:
            path = self.manager.save(checkpoint_number=number)
        except (tf.errors.OpError, OSError) as error:
            _remove(glob.glob(os.path.join(self.directory, f"ckpt-{number}[._]*")))
            previous = self.manager.latest_checkpoint
            kept = (
                f"the previous checkpoint {os.path.basename(previous)} is intact: resume from it "
                "with the same command once there is room"
                if previous
                else "there is no earlier checkpoint"
            )
            raise ValueError(
                f"cannot write checkpoint ckpt-{number} in {self.directory} "
                f"({type(error).__name__}: {io_failure(error)}); {kept}"
            ) from error
        # Older checkpoints go by their files too: the manager forgets those its list lost.
        for old in _found(self.directory)[: -self._keep]:
            _remove(glob.glob(f"{old}.*"))
        return os.path.basename(path)


def _remove_unfinished(directory: str) -> None:
    """Removes what a save killed midway left: TensorFlow's `ckpt-<n>_temp` folders and data
    files whose index was never written."""
    finished = {path[: -len(".index")] for path in glob.glob(os.path.join(directory, "*.index"))}
    _remove(
        glob.glob(os.path.join(directory, "ckpt-*_temp"))
        + [
            path
            for path in glob.glob(os.path.join(directory, "ckpt-*.data-*"))
            if path.split(".data-")[0] not in finished
        ]
    )


def _remove(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def _found(directory: str) -> list[str]:
    """The checkpoints in `directory` by their index files, oldest first."""
    numbers = []
    for index in glob.glob(os.path.join(directory, "ckpt-*.index")):
        match = re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(index))
        if match:
            numbers.append(int(match.group(1)))
    return [os.path.join(directory, f"ckpt-{n}") for n in sorted(numbers)]


class _UnrestoredFilter:
    """Drops TensorFlow's warnings about a checkpoint object deleted with unrestored values (a
    screenful per failed attempt, after the one-line error that says why)."""

    @staticmethod
    def filter(record) -> bool:
        message = record.getMessage()
        return not (
            "being deleted with unrestored values" in message
            or "Value in checkpoint could not be found" in message
        )


def _silence_unrestored_warnings() -> None:
    tf.get_logger().addFilter(_UnrestoredFilter)
