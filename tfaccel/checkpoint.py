"""Resume state: everything needed to continue a run, in a TensorFlow checkpoint.

Networks, optimizer slots, counters and the policy's random generator are TensorFlow objects, so
one `tf.train.Checkpoint` holds them and nothing is pickled. `CheckpointManager` keeps the last few
and writes each checkpoint's index last, so a checkpoint is complete or not listed.
"""

from __future__ import annotations

import os

import tensorflow as tf


class Counters(tf.Module):
    """Run counters that must survive a restart."""

    def __init__(self):
        super().__init__(name="counters")
        self.agent_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="agent_steps")
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.games = tf.Variable(0, dtype=tf.int64, trainable=False, name="games")
        self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="wall_seconds")


class Checkpointer:
    """Saves and restores `trackables` under `directory`, keeping the last `keep`."""

    def __init__(self, directory: str, keep: int = 3, **trackables):
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)

    def restore(self) -> str | None:
        """Restores the latest checkpoint if there is one; returns its path."""
        path = self.manager.latest_checkpoint
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return path

    def save(self, number: int) -> str:
        path = self.manager.save(checkpoint_number=number)
        return os.path.basename(path)
