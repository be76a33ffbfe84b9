import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.algorithms.test_a2c import TinyNetwork, random_rollout
from tfaccel.algorithms import a2c, ppo
from tfaccel.types import Rollout


def make_batch(n, action, old_log_prob, advantage, old_value, value_target):
    return ppo.PPOBatch(
        observation=np.zeros((n, 2, 2, 1), np.uint8),
        action=np.array(action, np.int32),
        old_log_prob=np.array(old_log_prob, np.float32),
        old_value=np.array(old_value, np.float32),
        advantage=np.array(advantage, np.float32),
        value_target=np.array(value_target, np.float32),
    )


def test_prepare_uses_the_recorded_values_and_bootstraps_from_the_network():
    # The GAE docstring example: discount 0.5, lambda 0.5, reward [1, 2, 3] down each of 3 envs,
    # recorded value 1, env 1 truncated at t = 1 (truncation_value 10), env 2 terminated at t = 1.
    # The network's value is 1 + 0.25 * sum(pixels / 255) = 2 on the all-255 frames: 2 is the
    # bootstrap value, and the recorded values (1), not the network's (2), enter the deltas.
    network = TinyNetwork(4, value_kernel=0.25, value_bias=1.0)
    rollout = Rollout(
        observation=np.full((3, 3, 2, 2, 1), 255, np.uint8),
        action=np.zeros((3, 3), np.int32),
        reward=np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]], np.float32),
        terminated=np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0]], bool),
        truncated=np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool),
        truncation_value=np.array([[0, 0, 0], [0, 10, 0], [0, 0, 0]], np.float32),
        log_prob=np.zeros((3, 3), np.float32),
        value=np.ones((3, 3), np.float32),
        bootstrap_observation=np.full((3, 2, 2, 1), 255, np.uint8),
    )
    advantage, value_target = ppo.prepare(
        network, rollout, ppo.PPOConfig(discount=0.5, gae_lambda=0.5)
    )
    expected = np.array([[1.0625, 2, 0.75], [2.25, 6, 1], [3, 3, 3]], np.float32)
    np.testing.assert_array_equal(advantage, expected)
    np.testing.assert_array_equal(value_target, expected + 1)

    batch = ppo.flatten(rollout, advantage, value_target)
    assert batch.observation.shape == (9, 2, 2, 1) and batch.action.dtype == tf.int32
    np.testing.assert_array_equal(batch.advantage, expected.reshape(-1))  # sample t * B + b
    np.testing.assert_array_equal(batch.old_value, np.ones(9))


def test_loss_at_ratio_one_by_hand():
    # Uniform policy over 4 actions (log pi = -log 4 = old_log_prob, so the ratio is 1) and
    # V = 1. Normalized advantages have mean 0, so policy_loss = -mean(1 * A_norm) = 0.
    # value_loss = 0.5 * mean((1 - [0, 2, 3, 1])^2) = 0.5 * (1 + 1 + 4 + 0) / 4 = 0.75.
    # loss = 0 + 1.0 * 0.75 - 0.01 * log 4.
    network = TinyNetwork(4, value_bias=1.0)
    batch = make_batch(4, [0, 1, 2, 3], [-math.log(4)] * 4, [1, -2, 0.5, 3], [1] * 4, [0, 2, 3, 1])
    loss, metrics = ppo.loss(network, batch, ppo.PPOConfig(), clip=0.1)
    assert float(loss) == pytest.approx(0.75 - 0.01 * math.log(4), abs=1e-6)
    assert float(metrics["policy_loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["value_loss"]) == pytest.approx(0.75)
    assert float(metrics["entropy"]) == pytest.approx(math.log(4))
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(metrics["approx_kl"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["advantage_mean"]) == pytest.approx(0.625)  # before normalization
    assert float(metrics["value_std"]) == 0.0  # V = 1 on every observation
    assert all(m.shape == () and m.dtype == tf.float32 for m in metrics.values())


def test_ratio_outside_the_clip_range_is_clipped():
    # Uniform policy over 4 actions; old_log_prob = -log 4 - log 2, so both ratios are 2.
    # clip 0.1, advantages [1, -1] (not normalized), value_target = V = 1 (no value loss):
    # sample 0: min(2 * 1, 1.1 * 1) = 1.1 (clipped); sample 1: min(2 * -1, 1.1 * -1) = -2.
    # policy_loss = -(1.1 - 2) / 2 = 0.45; approx_kl = (2 - 1) - log 2; clip_fraction = 1.
    # Gradient: the clipped sample 0 gives none; sample 1's term -(1/2) * -ratio has
    # d/d logit_j = ratio * (1[j = 1] - 1/4) / 2 = [-0.25, 0.75, -0.25, -0.25] (entropy: 0 at
    # the uniform policy).
    network = TinyNetwork(4, value_bias=1.0)
    old_log_prob = [-math.log(4) - math.log(2)] * 2
    batch = make_batch(2, [0, 1], old_log_prob, [1, -1], [1, 1], [1, 1])
    config = ppo.PPOConfig(normalize_advantage=False)
    with tf.GradientTape() as tape:
        loss, metrics = ppo.loss(network, batch, config, clip=tf.constant(0.1))
    assert float(metrics["policy_loss"]) == pytest.approx(0.45)
    assert float(loss) == pytest.approx(0.45 - 0.01 * math.log(4))
    assert float(metrics["approx_kl"]) == pytest.approx(1 - math.log(2))
    assert float(metrics["clip_fraction"]) == 1.0
    gradient = tape.gradient(loss, network.policy_head.bias)
    np.testing.assert_allclose(gradient, [-0.25, 0.75, -0.25, -0.25], atol=1e-6)


@pytest.mark.parametrize("clip_value, expected", [(False, 0.5), (True, 1.805)])
def test_value_clipping_by_hand(clip_value, expected):
    # V = 1, old_value 0, target 2, clip 0.1. Unclipped: 0.5 * (1 - 2)^2 = 0.5. Clipped:
    # V_clipped = 0 + clip(1 - 0, -0.1, 0.1) = 0.1, 0.5 * max(1, (0.1 - 2)^2 = 3.61) = 1.805.
    network = TinyNetwork(4, value_bias=1.0)
    batch = make_batch(1, [0], [-math.log(4)], [0.0], [0.0], [2.0])
    config = ppo.PPOConfig(clip_value=clip_value)
    _, metrics = ppo.loss(network, batch, config, clip=0.1)
    assert float(metrics["value_loss"]) == pytest.approx(expected)


def test_loss_falls_after_one_gradient_step():
    network = TinyNetwork(3, observation_shape=(4, 4, 2), seed=0)
    rollout = random_rollout(seed=2)
    steps, envs = rollout.reward.shape
    flat = rollout.observation.reshape(steps * envs, 4, 4, 2)
    action, log_prob, value = a2c.act(network, flat, tf.constant([0, 1]))
    rollout = rollout._replace(
        action=tf.reshape(action, [steps, envs]),
        log_prob=tf.reshape(log_prob, [steps, envs]),
        value=tf.reshape(value, [steps, envs]),
    )
    config = ppo.PPOConfig(clip_value=True)
    batch = ppo.flatten(rollout, *ppo.prepare(network, rollout, config))
    optimizer = keras.optimizers.SGD(learning_rate=0.01)  # 0.05 moves V beyond the value clip

    @tf.function
    def train_step(batch, clip):
        with tf.GradientTape() as tape:
            loss, metrics = ppo.loss(network, batch, config, clip)
        grads = tape.gradient(loss, network.trainable_variables)
        optimizer.apply_gradients(zip(grads, network.trainable_variables, strict=True))
        return loss, metrics

    before, metrics = train_step(batch, tf.constant(0.1))
    assert float(metrics["approx_kl"]) == pytest.approx(0.0, abs=1e-6)  # the acting parameters
    assert float(metrics["clip_fraction"]) == 0.0
    after, _ = ppo.loss(network, batch, config, clip=0.1)
    assert float(after) < float(before)
