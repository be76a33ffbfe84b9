"""Keras 3 networks of the papers. Inputs are uint8 frames [B, H, W, C], scaled inside the model.

- `a3c_torso`: the policy-gradient network of Mnih et al. (2016) used by Stooke & Abbeel (2018)
  and PAAC: conv 16 8x8/4, conv 32 4x4/2, FC 256, ReLU.
- `nature_torso`: the Nature DQN network (Mnih et al., 2015): conv 32 8x8/4, conv 64 4x4/2,
  conv 64 3x3/1, FC 512, ReLU.

Shapes and action counts come from the env's spec, never from configuration.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfaccel.types import EnvSpec


def a3c_torso() -> list[keras.layers.Layer]:
    return [
        keras.layers.Conv2D(16, 8, strides=4, activation="relu", name="conv1"),
        keras.layers.Conv2D(32, 4, strides=2, activation="relu", name="conv2"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(256, activation="relu", name="fc"),
    ]


def nature_torso() -> list[keras.layers.Layer]:
    return [
        keras.layers.Conv2D(32, 8, strides=4, activation="relu", name="conv1"),
        keras.layers.Conv2D(64, 4, strides=2, activation="relu", name="conv2"),
        keras.layers.Conv2D(64, 3, strides=1, activation="relu", name="conv3"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(512, activation="relu", name="fc"),
    ]


class PolicyValueNetwork(keras.Model):
    """Policy logits [B, A] and state value [B] over a shared torso."""

    def __init__(self, spec: EnvSpec, torso=a3c_torso, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.torso = keras.Sequential(torso(), name="torso")
        self.policy_head = keras.layers.Dense(spec.num_actions, name="logits")
        self.value_head = keras.layers.Dense(1, name="value")
        self.build((None, *spec.observation.shape))

    def build(self, input_shape):
        self.torso.build(input_shape)
        features = self.torso.compute_output_shape(input_shape)
        self.policy_head.build(features)
        self.value_head.build(features)
        self.built = True

    def call(self, observation):
        x = tf.cast(observation, tf.float32) * (1.0 / 255.0)  # [B, H, W, C]
        features = self.torso(x)  # [B, F]
        return self.policy_head(features), tf.squeeze(self.value_head(features), -1)
