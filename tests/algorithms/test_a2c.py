import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.algorithms import a2c
from tfaccel.algorithms.a2c import A2CConfig
from tfaccel.types import Rollout


class TinyNetwork(keras.Model):
    """`PolicyValueNetwork`'s signature on a linear model: x = flattened uint8 observation / 255,
    logits = x @ W_pi + b_pi, value = x @ w_v + b_v. Constant weights unless `seed` is given."""

    def __init__(
        self,
        num_actions,
        observation_shape=(2, 2, 1),
        policy_kernel=0.0,
        value_kernel=0.0,
        value_bias=0.0,
        seed=None,
    ):
        super().__init__()

        def kernel(constant, offset):
            if seed is None:
                return keras.initializers.Constant(constant)
            return keras.initializers.GlorotUniform(seed=seed + offset)

        self.flatten = keras.layers.Flatten()
        self.policy_head = keras.layers.Dense(
            num_actions, kernel_initializer=kernel(policy_kernel, 0)
        )
        self.value_head = keras.layers.Dense(
            1,
            kernel_initializer=kernel(value_kernel, 1),
            bias_initializer=keras.initializers.Constant(value_bias),
        )
        self(np.zeros((1, *observation_shape), np.uint8))  # build

    def call(self, observation):
        x = self.flatten(tf.cast(observation, tf.float32) / 255.0)  # [N, P]
        return self.policy_head(x), tf.squeeze(self.value_head(x), -1)


def random_rollout(seed, steps=5, envs=4, observation_shape=(4, 4, 2), num_actions=3):
    rng = np.random.default_rng(seed)
    shape = (steps, envs)
    return Rollout(
        observation=rng.integers(0, 256, (*shape, *observation_shape), dtype=np.uint8),
        action=rng.integers(0, num_actions, shape, dtype=np.int32),
        reward=rng.choice([-1.0, 0.0, 1.0], shape).astype(np.float32),
        terminated=rng.random(shape) < 0.15,
        truncated=rng.random(shape) < 0.15,
        truncation_value=rng.normal(size=shape).astype(np.float32),
        log_prob=np.full(shape, -math.log(num_actions), np.float32),
        value=np.zeros(shape, np.float32),
        bootstrap_observation=rng.integers(0, 256, (envs, *observation_shape), dtype=np.uint8),
    )


def hand_rollout():
    """T = 2, B = 2 on 2x2x1 frames: all-zero observations, an all-255 bootstrap observation."""
    return Rollout(
        observation=np.zeros((2, 2, 2, 2, 1), np.uint8),
        action=np.array([[0, 1], [2, 3]], np.int32),
        reward=np.array([[1, 0], [0, 2]], np.float32),
        terminated=np.array([[False, True], [False, False]]),
        truncated=np.array([[False, False], [False, True]]),
        truncation_value=np.array([[0, 0], [0, 3]], np.float32),
        log_prob=np.zeros((2, 2), np.float32),  # unused by the A2C loss
        value=np.zeros((2, 2), np.float32),  # unused by the A2C loss
        bootstrap_observation=np.full((2, 2, 2, 1), 255, np.uint8),
    )


def test_loss_by_hand():
    # A = 4 actions with zero policy weights: uniform policy, log pi = -log 4, entropy = log 4.
    # Value = 1 + 0.25 * sum(pixels / 255): 1 on the zero observations, 2 on the bootstrap one.
    # discount 0.5. Env 0: G_1 = 0 + 0.5 * 2 = 1, G_0 = 1 + 0.5 * 1 = 1.5.
    # Env 1: G_1 = 2 + 0.5 * 3 (truncated) = 3.5, G_0 = 0 (terminated).
    # returns [[1.5, 0], [1, 3.5]], advantage = returns - 1 = [[0.5, -1], [0, 2.5]], mean 0.5.
    # policy_loss = -mean(-log 4 * advantage) = 0.5 * log 4 = log 2.
    # value_loss = 0.5 * mean(advantage^2) = 0.5 * (0.25 + 1 + 0 + 6.25) / 4 = 0.9375.
    # loss = log 2 + 0.5 * 0.9375 - 0.01 * log 4.
    network = TinyNetwork(4, value_kernel=0.25, value_bias=1.0)
    config = a2c.A2CConfig(discount=0.5, sum_over_time=False)
    with tf.GradientTape() as tape:
        loss, metrics = a2c.loss(network, hand_rollout(), config)
    assert float(loss) == pytest.approx(math.log(2) + 0.5 * 0.9375 - 0.01 * math.log(4))
    assert float(metrics["loss"]) == float(loss)
    assert float(metrics["policy_loss"]) == pytest.approx(math.log(2))
    assert float(metrics["value_loss"]) == pytest.approx(0.9375)
    assert float(metrics["entropy"]) == pytest.approx(math.log(4))
    assert float(metrics["advantage_mean"]) == pytest.approx(0.5)
    assert float(metrics["return_mean"]) == pytest.approx(1.5)
    assert float(metrics["value_mean"]) == pytest.approx(1.0)
    assert float(metrics["explained_variance"]) == pytest.approx(0.0)  # a constant V
    assert float(metrics["value_std"]) == 0.0  # the same V on every observation
    assert all(m.shape == () and m.dtype == tf.float32 for m in metrics.values())

    # Gradients. Value bias: 0.5 * mean(V - G) = 0.5 * -0.5 = -0.25, only if the advantage is
    # stopped in the policy term and the bootstrap is stopped. Value kernel: 0 (the observations
    # are zero; only the stopped bootstrap sees pixels). Policy bias: at the uniform policy the
    # entropy gradient vanishes and d policy_loss / d logit_j = -mean(adv_i * (1[a_i = j] - 1/4))
    # = -(adv_j - 2 / 4) / 4 with actions 0..3 in order: [0, 0.375, 0.125, -0.5].
    variables = [network.value_head.bias, network.value_head.kernel, network.policy_head.bias]
    value_bias, value_kernel, policy_bias = tape.gradient(loss, variables)
    np.testing.assert_allclose(value_bias, [-0.25], atol=1e-6)
    np.testing.assert_array_equal(value_kernel, np.zeros((4, 1)))
    np.testing.assert_allclose(policy_bias, [0, 0.375, 0.125, -0.5], atol=1e-6)

    # PAAC's scale: the loss summed over the T = 2 steps of each env, averaged over envs.
    summed, summed_metrics = a2c.loss(network, hand_rollout(), A2CConfig(discount=0.5))
    assert float(summed) == pytest.approx(2 * float(loss))
    assert float(summed_metrics["loss"]) == pytest.approx(float(loss))  # metrics stay means


def test_value_std_is_the_spread_of_the_values_over_the_rollout():
    network = TinyNetwork(3, observation_shape=(4, 4, 2), seed=5)
    rollout = random_rollout(6)
    _, metrics = a2c.loss(network, rollout, A2CConfig())
    _, values = network(rollout.observation.reshape(-1, 4, 4, 2))  # [T*B]
    assert float(metrics["value_std"]) == pytest.approx(float(np.std(values)), rel=1e-5)
    assert float(metrics["value_std"]) > 0.01


def test_loss_falls_after_one_gradient_step():
    network = TinyNetwork(3, observation_shape=(4, 4, 2), seed=0)
    rollout = Rollout(*(tf.constant(field) for field in random_rollout(seed=1)))
    optimizer = keras.optimizers.SGD(learning_rate=0.05)
    config = a2c.A2CConfig()

    @tf.function
    def train_step(rollout):
        with tf.GradientTape() as tape:
            loss, _ = a2c.loss(network, rollout, config)
        grads = tape.gradient(loss, network.trainable_variables)
        optimizer.apply_gradients(zip(grads, network.trainable_variables, strict=True))
        return loss

    before = float(train_step(rollout))
    after, _ = a2c.loss(network, rollout, config)
    assert float(after) < before


def test_act_samples_from_the_policy():
    network = TinyNetwork(4, value_bias=0.5)
    observation = np.zeros((64, 2, 2, 1), np.uint8)
    action, log_prob, value = a2c.act(network, observation)
    assert action.dtype == tf.int32 and action.shape == (64,)
    assert set(action.numpy()) <= {0, 1, 2, 3}
    np.testing.assert_allclose(log_prob, np.full(64, -math.log(4)), rtol=1e-6)
    np.testing.assert_allclose(value, np.full(64, 0.5))

    network.policy_head.bias.assign([0.0, 0.0, 50.0, 0.0])  # pi(2) = 1 - 3e-22
    act = tf.function(
        lambda observation, seed: a2c.act(network, observation, seed),
        input_signature=[
            tf.TensorSpec([None, 2, 2, 1], tf.uint8),
            tf.TensorSpec([2], tf.int32),
        ],
    )
    action, log_prob, _ = act(tf.constant(observation), tf.constant([1, 2]))
    np.testing.assert_array_equal(action, np.full(64, 2))
    np.testing.assert_allclose(log_prob, np.zeros(64), atol=1e-6)


def test_act_with_a_seed_or_a_generator_is_deterministic():
    network = TinyNetwork(4)
    observation = np.zeros((32, 2, 2, 1), np.uint8)
    first, _, _ = a2c.act(network, observation, tf.constant([3, 4]))
    second, _, _ = a2c.act(network, observation, tf.constant([3, 4]))
    other, _, _ = a2c.act(network, observation, tf.constant([5, 6]))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)  # 4^-32 chance of a false failure, fixed by seeds

    def compiled(generator):  # as the sampler wraps it
        spec = tf.TensorSpec([32, 2, 2, 1], tf.uint8)
        return tf.function(lambda obs: a2c.act(network, obs, generator), input_signature=[spec])

    run, rerun = (compiled(tf.random.Generator.from_seed(7)) for _ in range(2))
    actions = [run(observation)[0].numpy() for _ in range(2)]
    np.testing.assert_array_equal(actions, [rerun(observation)[0].numpy() for _ in range(2)])
    assert not np.array_equal(*actions)  # the generator advances between calls
