import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import networks
from tfaccel.algorithms import dqn
from tfaccel.algorithms.dqn import DQNConfig
from tfaccel.replay import ReplayBatch
from tfaccel.types import ArraySpec, EnvSpec


class TinyQNetwork(keras.Model):
    """`QNetwork`'s signature on a linear model: x = flattened uint8 observation / 255,
    out = x @ W + b, reshaped to [N, A] (num_atoms 1) or [N, A, num_atoms]. Every entry of W is
    `kernel`; b is `bias` (flattened over actions, then atoms)."""

    def __init__(
        self, num_actions, num_atoms=1, kernel=0.0, bias=None, observation_shape=(2, 2, 1)
    ):
        super().__init__()
        self.num_actions, self.num_atoms = num_actions, num_atoms
        self.flatten = keras.layers.Flatten()
        self.head = keras.layers.Dense(
            num_actions * num_atoms, kernel_initializer=keras.initializers.Constant(kernel)
        )
        self(np.zeros((1, *observation_shape), np.uint8))  # build
        if bias is not None:
            self.head.bias.assign(np.asarray(bias, np.float32).reshape(-1))

    def call(self, observation):
        x = self.flatten(tf.cast(observation, tf.float32) / 255.0)  # [N, P]
        out = self.head(x)  # [N, A * atoms]
        if self.num_atoms == 1:
            return out
        return tf.reshape(out, [-1, self.num_actions, self.num_atoms])


def hand_batch(weight=(1.0, 1.0)):
    """N = 2 on 2x2x1 frames: o_tm1 all zero; o_t all 255 for sample 0, zero for sample 1."""
    return ReplayBatch(
        observation=np.zeros((2, 2, 2, 1), np.uint8),
        action=np.array([0, 1], np.int32),
        reward=np.array([1.0, 0.0], np.float32),
        discount=np.array([0.5, 0.0], np.float32),  # sample 1 terminal
        next_observation=np.stack(
            [np.full((2, 2, 1), 255, np.uint8), np.zeros((2, 2, 1), np.uint8)]
        ),
        weight=np.asarray(weight, np.float32),
        index=np.array([0, 1], np.int64),
    )


def hand_networks():
    # online: Q = [2, 1] everywhere. target: Q(zeros) = [0, 3], Q(all 255) = 4 * 0.5 + b = [2, 5].
    return TinyQNetwork(2, bias=[2.0, 1.0]), TinyQNetwork(2, kernel=0.5, bias=[0.0, 3.0])


def random_batch(seed, n=8, observation_shape=(6, 6, 2), num_actions=3):
    rng = np.random.default_rng(seed)
    return ReplayBatch(
        observation=rng.integers(0, 256, (n, *observation_shape), dtype=np.uint8),
        action=rng.integers(0, num_actions, n, dtype=np.int32),
        reward=rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32),
        discount=rng.choice([0.0, 0.99], n).astype(np.float32),
        next_observation=rng.integers(0, 256, (n, *observation_shape), dtype=np.uint8),
        weight=rng.uniform(0.5, 1.0, n).astype(np.float32),
        index=np.arange(n, dtype=np.int64),
    )


def tiny_torso():
    return [keras.layers.Flatten(), keras.layers.Dense(16, activation="relu")]


def spec(shape=(6, 6, 2), num_actions=3):
    return EnvSpec(ArraySpec(shape, np.dtype(np.uint8)), num_actions)


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("num_atoms", [1, 51])
def test_q_network_output_shapes(dueling, num_atoms):
    keras.utils.set_random_seed(0)
    network = networks.QNetwork(
        spec((104, 80, 4), 6), torso=networks.a3c_torso, dueling=dueling, num_atoms=num_atoms
    )
    out = network(np.zeros((5, 104, 80, 4), np.uint8))
    assert out.shape == ((5, 6) if num_atoms == 1 else (5, 6, 51))


@pytest.mark.parametrize("num_atoms", [1, 5])
def test_dueling_combination_has_zero_mean_advantage(num_atoms):
    keras.utils.set_random_seed(1)
    network = networks.QNetwork(spec(), torso=tiny_torso, dueling=True, num_atoms=num_atoms)
    observation = np.random.default_rng(0).integers(0, 256, (4, 6, 6, 2), dtype=np.uint8)
    out = network(observation).numpy()
    out = out if num_atoms > 1 else out[..., None]  # [B, A, N]
    features = network.torso(observation.astype(np.float32) / 255.0)
    value = network.value_head(features).numpy()  # [B, N]
    # mean_a Q = V + mean_a A - mean_a A = V, per atom.
    np.testing.assert_allclose(out.mean(axis=1), value, atol=1e-5)


def test_scalar_loss_by_hand():
    online, target = hand_networks()
    total, metrics = dqn.loss(online, hand_batch(), DQNConfig(), target=target)
    # Not double: a* = argmax Q_target(o_t) = 1 for both samples.
    # sample 0: y = 1 + 0.5 * 5 = 3.5, Q(o_tm1, 0) = 2, td = 1.5 -> huber 1.5 - 0.5 = 1.0
    # sample 1: y = 0 (terminal), Q(o_tm1, 1) = 1, td = -1 -> huber 0.5
    np.testing.assert_allclose(total.numpy(), 0.75, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"].numpy(), 0.75, rtol=1e-6)
    np.testing.assert_allclose(metrics["q_mean"].numpy(), 1.5, rtol=1e-6)
    np.testing.assert_allclose(metrics["q_std"].numpy(), 0.5, rtol=1e-6)  # Q_tm1 = [2, 1]
    np.testing.assert_allclose(metrics["target_mean"].numpy(), 1.75, rtol=1e-6)
    np.testing.assert_allclose(metrics["priority"].numpy(), [1.5, 1.0], rtol=1e-6)


def test_double_picks_the_online_argmax():
    online, target = hand_networks()
    total, metrics = dqn.loss(online, hand_batch(), DQNConfig(double=True), target=target)
    # Double: a* = argmax Q_online(o_t) = 0, evaluated by the target: Q_target(o_t0, 0) = 2.
    # sample 0: y = 1 + 0.5 * 2 = 2, td = 0 -> 0; sample 1 as before -> 0.5.
    np.testing.assert_allclose(total.numpy(), 0.25, rtol=1e-6)
    np.testing.assert_allclose(metrics["target_mean"].numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["priority"].numpy(), [0.0, 1.0], atol=1e-6)


def test_importance_weights_scale_the_loss():
    online, target = hand_networks()
    total, _ = dqn.loss(online, hand_batch(weight=(2.0, 0.0)), DQNConfig(), target=target)
    np.testing.assert_allclose(total.numpy(), (2.0 * 1.0 + 0.0 * 0.5) / 2, rtol=1e-6)
    keras.utils.set_random_seed(2)
    online = networks.QNetwork(spec(), torso=tiny_torso, num_atoms=5)
    target = networks.QNetwork(spec(), torso=tiny_torso, num_atoms=5)
    batch = random_batch(0)
    config = DQNConfig(num_atoms=5)
    base, _ = dqn.loss(online, batch, config, target=target)
    scaled, _ = dqn.loss(online, batch._replace(weight=3.0 * batch.weight), config, target=target)
    np.testing.assert_allclose(scaled.numpy(), 3.0 * base.numpy(), rtol=1e-5)


def test_categorical_loss_by_hand():
    # Support [-1, 0, 1]. Online logits of action 0: [0, ln 2, 0] -> p = [1/4, 1/2, 1/4].
    online = TinyQNetwork(2, num_atoms=3, bias=[[0.0, math.log(2.0), 0.0], [0.0, 0.0, 0.0]])
    target = TinyQNetwork(2, num_atoms=3)  # uniform [1/3, 1/3, 1/3] for both actions
    batch = ReplayBatch(
        observation=np.zeros((1, 2, 2, 1), np.uint8),
        action=np.array([0], np.int32),
        reward=np.array([0.5], np.float32),
        discount=np.array([0.5], np.float32),
        next_observation=np.zeros((1, 2, 2, 1), np.uint8),
        weight=np.ones(1, np.float32),
        index=np.zeros(1, np.int64),
    )
    config = DQNConfig(num_atoms=3, v_min=-1.0, v_max=1.0)
    total, metrics = dqn.loss(online, batch, config, target=target)
    # Tz = 0.5 + 0.5 * [-1, 0, 1] = [0, 0.5, 1]: m = [0, 1/3 + 1/6, 1/6 + 1/3] = [0, 1/2, 1/2].
    # cross-entropy = -(0.5 ln 1/2 + 0.5 ln 1/4) = 1.5 ln 2; KL = 1.5 ln 2 - H(m) = 0.5 ln 2.
    np.testing.assert_allclose(total.numpy(), 1.5 * math.log(2.0), rtol=1e-5)
    np.testing.assert_allclose(metrics["priority"].numpy(), [0.5 * math.log(2.0)], rtol=1e-4)
    np.testing.assert_allclose(metrics["q_mean"].numpy(), 0.0, atol=1e-6)
    np.testing.assert_allclose(metrics["target_mean"].numpy(), 0.5, rtol=1e-5)


@pytest.mark.parametrize("num_atoms,double", [(1, False), (1, True), (51, False), (51, True)])
def test_metrics_and_priority_shape(num_atoms, double):
    keras.utils.set_random_seed(3)
    online = networks.QNetwork(spec(), torso=tiny_torso, dueling=True, num_atoms=num_atoms)
    target = networks.QNetwork(spec(), torso=tiny_torso, dueling=True, num_atoms=num_atoms)
    total, metrics = dqn.loss(
        online, random_batch(1), DQNConfig(double=double, num_atoms=num_atoms), target=target
    )
    assert total.shape == ()
    assert metrics["priority"].shape == (8,)
    assert (metrics["priority"].numpy() >= 0.0).all()
    for key in ("loss", "q_mean", "target_mean"):
        assert metrics[key].shape == ()


@pytest.mark.parametrize("num_atoms", [1, 51])
def test_loss_falls_after_one_gradient_step(num_atoms):
    keras.utils.set_random_seed(4)
    online = networks.QNetwork(spec(), torso=tiny_torso, num_atoms=num_atoms)
    target = networks.QNetwork(spec(), torso=tiny_torso, num_atoms=num_atoms)
    batch = random_batch(2)
    config = DQNConfig(double=True, num_atoms=num_atoms)
    optimizer = keras.optimizers.SGD(learning_rate=0.05)
    with tf.GradientTape() as tape:
        before, _ = dqn.loss(online, batch, config, target=target)
    gradients = tape.gradient(before, online.trainable_variables)
    assert all(g is not None for g in gradients)
    optimizer.apply_gradients(zip(gradients, online.trainable_variables, strict=True))
    after, _ = dqn.loss(online, batch, config, target=target)
    assert after.numpy() < before.numpy()


def test_target_network_gets_no_gradient():
    online, target = hand_networks()
    with tf.GradientTape() as tape:
        total, _ = dqn.loss(online, hand_batch(), DQNConfig(double=True), target=target)
    gradients = tape.gradient(total, target.trainable_variables)
    assert all(g is None for g in gradients)


def test_act_epsilon_zero_is_greedy():
    network = TinyQNetwork(4, bias=[0.0, 3.0, 1.0, 2.0])
    observation = np.zeros((16, 2, 2, 1), np.uint8)
    action = dqn.act(network, observation, 0.0, tf.random.Generator.from_seed(0))
    assert action.dtype == tf.int32
    np.testing.assert_array_equal(action.numpy(), np.full(16, 1))


def test_act_categorical_is_greedy_on_the_expected_value():
    # Support [-1, 0, 1]: action 0 puts its mass on -1, action 1 on +1.
    network = TinyQNetwork(2, num_atoms=3, bias=[[5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    atoms = dqn.support(DQNConfig(num_atoms=3, v_min=-1.0, v_max=1.0))
    action = dqn.act(
        network, np.zeros((4, 2, 2, 1), np.uint8), 0.0, tf.random.Generator.from_seed(0), atoms
    )
    np.testing.assert_array_equal(action.numpy(), np.ones(4))


def test_act_epsilon_one_is_uniform():
    network = TinyQNetwork(4, bias=[0.0, 3.0, 1.0, 2.0])
    observation = np.zeros((4000, 2, 2, 1), np.uint8)
    action = dqn.act(network, observation, 1.0, tf.random.Generator.from_seed(0)).numpy()
    counts = np.bincount(action, minlength=4)
    np.testing.assert_allclose(counts / 4000, 0.25, atol=0.03)
    # A seed tensor makes the actions a function of the seed.
    seed = tf.constant([1, 2], tf.int64)
    seeded = dqn.act(network, observation, 0.5, seed).numpy()
    np.testing.assert_array_equal(dqn.act(network, observation, 0.5, seed).numpy(), seeded)
    other = dqn.act(network, observation, 0.5, tf.constant([1, 3], tf.int64)).numpy()
    assert np.mean(other != seeded) > 0.4  # 56% expected (each explores half the time)


def test_epsilon_schedule():
    config = DQNConfig()
    np.testing.assert_allclose(dqn.epsilon(config, 0), 1.0)
    np.testing.assert_allclose(dqn.epsilon(config, 125_000), 0.505, rtol=1e-6)
    np.testing.assert_allclose(dqn.epsilon(config, 10**7), 0.01, rtol=1e-6)


def test_act_and_loss_run_inside_tf_function():
    keras.utils.set_random_seed(5)
    online = networks.QNetwork(spec(), torso=tiny_torso, dueling=True, num_atoms=51)
    target = networks.QNetwork(spec(), torso=tiny_torso, dueling=True, num_atoms=51)
    config = DQNConfig(double=True, num_atoms=51)
    atoms = dqn.support(config)
    rng = tf.random.Generator.from_seed(0)
    act = tf.function(lambda o, e: dqn.act(online, o, e, rng, atoms))
    assert act(random_batch(3).observation, tf.constant(0.1)).shape == (8,)
    loss = tf.function(lambda batch: dqn.loss(online, batch, config, target=target))
    total, metrics = loss(random_batch(3))
    eager_total, _ = dqn.loss(online, random_batch(3), config, target=target)
    np.testing.assert_allclose(total.numpy(), eager_total.numpy(), rtol=1e-5)
