"""The generic learner: one compiled update lowers the loss; checkpoints round-trip exactly."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.algorithms.test_a2c import TinyNetwork, random_rollout
from tfaccel import checkpoint, learner
from tfaccel.algorithms import a2c, ppo


def make_learner(loss_fn, **kwargs):
    return learner.Learner(
        lambda: TinyNetwork(3, observation_shape=(4, 4, 2), seed=0),
        loss_fn,
        lambda: keras.optimizers.Adam(1e-2),
        max_grad_norm=1.0,
        **kwargs,
    )


def test_a2c_update_lowers_the_loss_on_a_fixed_batch():
    config = a2c.A2CConfig()
    agent = make_learner(lambda network, batch: a2c.loss(network, batch, config))
    rollout = random_rollout(seed=1)
    before = agent.train(rollout)
    _, after = a2c.loss(agent.network, rollout, config)
    assert float(after["loss"]) < before["loss"]  # both means over the batch
    assert before["grad_norm"] > 0
    assert int(agent.optimizer.iterations) == 1


def test_ppo_update_runs_epochs_times_minibatches_steps_and_lowers_the_loss():
    config = ppo.PPOConfig(epochs=3, minibatches=2)
    agent = make_learner(
        lambda network, batch: ppo.loss(network, batch, config),
        prepare_fn=lambda network, batch: ppo.samples(network, batch, config),
        epochs=config.epochs,
        minibatches=config.minibatches,
    )
    rollout = random_rollout(seed=2, steps=4, envs=4)
    whole = ppo.samples(agent.network, rollout, config)
    before, _ = ppo.loss(agent.network, whole, config)
    agent.train(rollout)
    after, _ = ppo.loss(agent.network, whole, config)
    assert int(agent.optimizer.iterations) == 6  # 3 epochs x 2 minibatches in one call
    assert float(after) < float(before)


def test_checkpoint_restores_network_optimizer_counters_and_generators(tmp_path):
    config = a2c.A2CConfig()
    agent = make_learner(lambda network, batch: a2c.loss(network, batch, config))
    agent.train(random_rollout(seed=3))
    counters = checkpoint.Counters()
    counters.agent_steps.assign(1234)
    counters.remember_scores([-21.0, -20.0, 3.0])
    saver = checkpoint.Checkpointer(
        str(tmp_path), network=agent.network, optimizer=agent.optimizer, counters=counters,
        generator=agent.generator,
    )  # fmt: skip
    saver.save(1)
    saved = [v.numpy().copy() for v in agent.network.variables + agent.optimizer.variables]
    draws = agent.generator.uniform([3]).numpy()

    agent.train(random_rollout(seed=4))  # change everything
    counters.agent_steps.assign(0)
    counters.remember_scores([1.0] * 30)
    assert not all(
        np.array_equal(a, v.numpy()) for a, v in zip(saved, agent.network.variables, strict=False)
    )

    assert saver.restore().endswith("ckpt-1")
    restored = [v.numpy() for v in agent.network.variables + agent.optimizer.variables]
    for a, b in zip(saved, restored, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(counters.agent_steps) == 1234
    assert counters.recalled_scores() == [-21.0, -20.0, 3.0]
    np.testing.assert_array_equal(agent.generator.uniform([3]).numpy(), draws)  # same stream


def test_checkpoint_from_an_older_program_restores_what_it_has(tmp_path):
    old = tf.Module()
    old.updates = tf.Variable(7, dtype=tf.int64)  # a counter the newer program still has
    old.steps = tf.Variable(1234, dtype=tf.int64)  # one it renamed (to agent_steps)
    checkpoint.Checkpointer(str(tmp_path), counters=old).save(1)
    newer = checkpoint.Counters()  # has more variables than the old program's counters
    newer.remember_scores([5.0])
    restored = checkpoint.Checkpointer(str(tmp_path), counters=newer)
    assert restored.restore().endswith("ckpt-1")
    assert int(newer.updates) == 7
    assert int(newer.agent_steps) == 0  # the checkpoint has no value for it
    assert newer.recalled_scores() == [5.0]  # nor for these


def test_a_prepared_batch_trains_exactly_as_its_numpy_arrays():
    config = a2c.A2CConfig()
    loss_fn = lambda network, batch: a2c.loss(network, batch, config)  # noqa: E731
    direct, prepared = make_learner(loss_fn), make_learner(loss_fn)
    rollout = random_rollout(seed=2)
    tensors = prepared.prepare(rollout)  # what a prefetch thread hands over
    assert all(isinstance(x, tf.Tensor) for x in tf.nest.flatten(tensors))
    assert type(tensors) is type(rollout)
    assert direct.train(rollout)["loss"] == prepared.train(tensors)["loss"]
    for a, b in zip(weights(direct), weights(prepared), strict=True):
        np.testing.assert_array_equal(a, b)


def test_target_network_changes_only_on_sync_and_per_sample_metrics_come_back():
    config = a2c.A2CConfig()

    def loss_fn(network, batch):
        loss, metrics = a2c.loss(network, batch, config)
        return loss, dict(metrics, per_sample=tf.fill([7], loss))  # a [N] metric

    agent = make_learner(loss_fn, target_network=True)
    same = zip(agent.target.variables, agent.network.variables, strict=True)
    assert all(np.array_equal(t.numpy(), o.numpy()) for t, o in same)
    metrics = agent.train(random_rollout(seed=5))
    assert metrics["per_sample"].shape == (7,) and isinstance(metrics["loss"], float)
    pairs = list(zip(agent.target.variables, agent.network.variables, strict=True))
    assert not all(np.array_equal(t.numpy(), o.numpy()) for t, o in pairs)
    agent.sync_target()
    assert all(np.array_equal(t.numpy(), o.numpy()) for t, o in pairs)


def weights(agent):
    return [v.numpy().copy() for v in agent.network.trainable_variables]


def test_a_nonfinite_loss_or_gradient_skips_the_step_and_says_where():
    config = a2c.A2CConfig()
    # 1: a NaN loss; 2: a NaN gradient of one variable, finite loss; 3: finite gradients whose
    # global norm overflows float32
    poison = tf.Variable(0.0)

    def loss_fn(network, batch):
        loss, metrics = a2c.loss(network, batch, config)
        last = network.trainable_variables[-1]
        bad_gradient = tf.sqrt(tf.reduce_sum(tf.square(last * 0.0)))  # 0, its gradient NaN
        loss = loss + tf.where(poison == 2.0, bad_gradient, 0.0)
        loss = loss + tf.where(poison == 3.0, 1e30 * tf.reduce_sum(last), 0.0)
        return tf.where(poison == 1.0, np.nan, loss), metrics

    agent = make_learner(loss_fn)
    rollout = random_rollout(seed=4)
    assert agent.train(rollout)["skipped_updates"] == 0.0 and agent.last_fault == ""
    before, steps = weights(agent), int(agent.optimizer.iterations)

    poison.assign(1.0)
    assert agent.train(rollout)["skipped_updates"] == 1.0
    assert agent.last_fault == "the loss"
    poison.assign(2.0)
    assert agent.train(rollout)["skipped_updates"] == 1.0
    assert agent.last_fault == f"the gradient of {agent.network.trainable_variables[-1].path}"
    poison.assign(3.0)
    assert agent.train(rollout)["skipped_updates"] == 1.0
    assert agent.last_fault.startswith("the gradients' global norm")
    for old, new in zip(before, weights(agent), strict=True):
        np.testing.assert_array_equal(old, new)  # neither step touched the weights
    assert int(agent.optimizer.iterations) == steps
    assert all(np.isfinite(v.numpy()).all() for v in agent.optimizer.variables)

    poison.assign(0.0)
    assert agent.train(rollout)["skipped_updates"] == 0.0
    assert int(agent.optimizer.iterations) == steps + 1


def test_ppo_counts_the_skipped_steps_of_its_minibatches():
    config = ppo.PPOConfig(epochs=2, minibatches=2)

    def nan_loss(network, batch):
        loss, metrics = ppo.loss(network, batch, config)
        return loss * np.nan, metrics

    agent = make_learner(
        nan_loss,
        prepare_fn=lambda network, batch: ppo.samples(network, batch, config),
        epochs=config.epochs,
        minibatches=config.minibatches,
    )
    assert agent.train(random_rollout(seed=5, steps=4, envs=4))["skipped_updates"] == 4.0
    assert int(agent.optimizer.iterations) == 0 and agent.last_fault == "the loss"


def test_fused_adam_follows_keras_adam_and_resumes_from_its_checkpoints(tmp_path):
    shapes = [(5, 7), (7,), (3, 3, 4, 2)]
    start = [
        np.random.default_rng(i).normal(size=s).astype(np.float32) for i, s in enumerate(shapes)
    ]

    def trained(optimizer, variables, steps):
        for _ in range(steps):  # the gradient of sum(v^4 / 4 - v / 2)
            optimizer.apply_gradients([(v**3 - 0.5, v) for v in variables])
        return [v.numpy() for v in variables]

    for rate in (1e-2, learner.linear_decay(1e-2, 100)):
        reference = trained(
            keras.optimizers.Adam(rate, epsilon=1e-5), list(map(tf.Variable, start)), 100
        )
        fused = trained(learner.FusedAdam(rate, epsilon=1e-5), list(map(tf.Variable, start)), 100)
        for before, one, two in zip(start, reference, fused, strict=True):
            assert np.abs(one - before).max() > 0.1  # they moved
            np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)

    # A run saved with Keras's Adam (tfaccel before FusedAdam) resumes with FusedAdam exactly.
    variables, adam = list(map(tf.Variable, start)), keras.optimizers.Adam(1e-2, epsilon=1e-5)
    trained(adam, variables, 50)
    path = tf.train.Checkpoint(optimizer=adam, variables=variables).save(str(tmp_path / "ckpt"))
    reference = trained(adam, variables, 50)
    resumed, fused = list(map(tf.Variable, start)), learner.FusedAdam(1e-2, epsilon=1e-5)
    fused.build(resumed)
    tf.train.Checkpoint(optimizer=fused, variables=resumed).restore(path).assert_consumed()
    assert int(fused.iterations) == 50
    for one, two in zip(reference, trained(fused, resumed, 50), strict=True):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)


def numpy_rmsprop(start, steps, rate, rho, epsilon, initial_mean_square):
    """TensorFlow 1's RMSProp, slowly: the twin of `make_rmsprop` on sum(v^4 / 4 - v / 2)."""
    variable, mean_square = start.astype(np.float64), np.full(start.shape, initial_mean_square)
    for _ in range(steps):
        gradient = variable**3 - 0.5
        mean_square = rho * mean_square + (1 - rho) * gradient**2
        variable = variable - rate * gradient / np.sqrt(mean_square + epsilon)
    return variable


def test_rmsprop_starts_its_mean_square_at_one_as_tensorflow_1_did(tmp_path):
    # One step at rate 0.1, decay 0.99, epsilon 1e-5, on a gradient of 3: from 1 (TensorFlow 1,
    # PAAC's and Baselines' runs) the mean square is 0.99 + 0.01 * 9 = 1.08 and the step
    # 0.3 / sqrt(1.08001) = 0.2887; from 0 (Keras) it is 0.09 and the step 0.3 / sqrt(0.09001)
    # = 0.99994, ten times the rate.
    for start, step in ((1.0, 0.2886738), (0.0, 0.9999444)):
        variable = tf.Variable([2.0])
        rmsprop = learner.make_rmsprop(0.1, epsilon=1e-5, initial_mean_square=start)
        rmsprop.apply_gradients([(tf.constant([3.0]), variable)])
        np.testing.assert_allclose(variable.numpy(), [2.0 - step], rtol=1e-6)

    start = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32)
    expected = numpy_rmsprop(start, 40, 1e-2, 0.99, 1e-5, 1.0)

    def trained(optimizer, variable, steps):
        for _ in range(steps):
            optimizer.apply_gradients([(variable**3 - 0.5, variable)])
        return variable.numpy()

    variable, rmsprop = tf.Variable(start), learner.make_rmsprop(1e-2, epsilon=1e-5)
    np.testing.assert_allclose(trained(rmsprop, variable, 40), expected, rtol=1e-4, atol=1e-5)
    # Saved after 20 steps and restored into a new optimizer, which starts from 1 itself: the
    # checkpoint's mean square wins, and the 20 steps after it are the same.
    variable, rmsprop = tf.Variable(start), learner.make_rmsprop(1e-2, epsilon=1e-5)
    trained(rmsprop, variable, 20)
    path = tf.train.Checkpoint(optimizer=rmsprop, variable=variable).save(str(tmp_path / "c"))
    resumed, again = tf.Variable(start), learner.make_rmsprop(1e-2, epsilon=1e-5)
    again.build([resumed])
    tf.train.Checkpoint(optimizer=again, variable=resumed).restore(path).assert_consumed()
    np.testing.assert_allclose(trained(again, resumed, 20), expected, rtol=1e-4, atol=1e-5)
    # Under a strategy too (the learner builds its optimizer in the strategy's scope).
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = learner.make_rmsprop(1e-2)
        mirrored.build([tf.Variable(start)])
    (velocity,) = [v for v in mirrored.variables if "velocity" in v.path]
    assert float(np.min(velocity)) == float(np.max(velocity)) == 1.0
    with pytest.raises(ValueError, match="make_rmsprop.initial_mean_square must be at least 0"):
        learner.make_rmsprop(1e-2, initial_mean_square=-1.0)


def test_warm_up_rises_linearly_then_follows_the_rate_or_its_decay():
    constant = learner.warm_up(1e-2, 10)
    steps = (0, 4, 9, 10, 500)
    np.testing.assert_allclose(
        [float(constant(s)) for s in steps], [1e-3, 5e-3, 1e-2, 1e-2, 1e-2], rtol=1e-6
    )
    decayed = learner.warm_up(learner.linear_decay(1e-2, 100), 10)
    np.testing.assert_allclose(
        [float(decayed(s)) for s in (0, 9, 50, 100)], [1e-3, 9.1e-3, 5e-3, 0.0], rtol=1e-6
    )
    assert learner.warm_up(1e-2, 0) == 1e-2
    # The optimizer takes it: Adam's first step moves a parameter by the warmed-up rate.
    variable, adam = tf.Variable([1.0]), learner.FusedAdam(constant)
    adam.apply_gradients([(tf.constant([0.3]), variable)])
    np.testing.assert_allclose(variable.numpy(), [1.0 - 1e-3], atol=1e-8)


@pytest.mark.parametrize("rate", [-1e-3, 0, 0.0, float("nan"), float("inf"), "7e-4", True])
def test_a_learning_rate_that_is_not_a_positive_number_is_refused(rate):
    with pytest.raises(ValueError, match=r"train.learning_rate must be a positive number"):
        learner.check_positive(rate, "train.learning_rate", "7e-4")


def test_a_positive_learning_rate_passes():
    for rate in (7e-4, 1, np.float32(1e-4)):
        learner.check_positive(rate, "train.learning_rate", "7e-4")


@pytest.mark.parametrize("kind", ["mirrored", "one_device"])
@pytest.mark.parametrize("algorithm", ["a2c", "ppo"])
def test_a_strategy_of_one_replica_trains_as_no_strategy(algorithm, kind):
    """`MirroredStrategy` on one device (one GPU, or `mirrored.gin` with one logical CPU) failed
    at the first update with TensorFlow's `merge_call` error: under any strategy the optimizer
    synchronizes inside `apply_gradients`, which a replica context cannot branch around.
    `OneDeviceStrategy` is a run's strategy on one GPU, and an asynchronous learner's."""
    if algorithm == "a2c":
        config = a2c.A2CConfig()
        kwargs = dict(loss_fn=lambda network, batch: a2c.loss(network, batch, config))
    else:
        # whole-batch steps: a strategy's random generator draws another minibatch order
        config = ppo.PPOConfig(epochs=3, minibatches=1)
        kwargs = dict(
            loss_fn=lambda network, batch: ppo.loss(network, batch, config),
            prepare_fn=lambda network, batch: ppo.samples(network, batch, config),
            epochs=config.epochs,
            minibatches=config.minibatches,
        )
    one = (
        tf.distribute.MirroredStrategy(["/cpu:0"])
        if kind == "mirrored"
        else tf.distribute.OneDeviceStrategy("/cpu:0")
    )
    plain, mirrored = (make_learner(strategy=strategy, **kwargs) for strategy in (None, one))
    for seed in range(2):
        for agent in (plain, mirrored):
            agent.train(random_rollout(seed=seed, steps=4, envs=4))
    for a, b in zip(weights(plain), weights(mirrored), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    bad = random_rollout(seed=5, steps=4, envs=4)
    reward = np.array(bad.reward, np.float32)
    reward[0, 0] = np.nan
    before = weights(mirrored)
    metrics = mirrored.train(bad._replace(reward=reward))
    assert metrics["skipped_updates"] >= 1.0 and mirrored.last_fault == "the loss"
    for old, new in zip(before, weights(mirrored), strict=True):
        np.testing.assert_array_equal(old, new)
