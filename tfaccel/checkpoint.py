"""Resume state: everything needed to continue a run, in a TensorFlow checkpoint.

Networks, optimizer slots, counters and the policy's random generator are TensorFlow objects, so
one `tf.train.Checkpoint` holds them and nothing is pickled. `CheckpointManager` keeps the last few
and writes each checkpoint's index last, so a checkpoint is complete or not listed.
"""

from __future__ import annotations

import os

import tensorflow as tf
from absl import logging


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
        return [float(s) for s in self.recent_scores.numpy()[: int(self.recent_count)]]


class Checkpointer:
    """Saves and restores `trackables` under `directory`, keeping the last `keep`."""

    def __init__(self, directory: str, keep: int = 3, **trackables):
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)

    def restore(self) -> str | None:
        """Restores the latest checkpoint if there is one; returns its path.

        Objects the program gained since the checkpoint was written (a new counter, say) keep
        their initial values, with a warning naming them; a checkpoint matching nothing raises.
        """
        path = self.manager.latest_checkpoint
        if path:
            status = self.checkpoint.restore(path)
            status.assert_nontrivial_match()
            try:
                status.assert_existing_objects_matched()
            except AssertionError as error:
                logging.warning("%s: restored partially: %s", path, str(error).splitlines()[0])
        return path

    def save(self, number: int) -> str:
        path = self.manager.save(checkpoint_number=number)
        return os.path.basename(path)
