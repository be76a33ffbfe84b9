import numpy as np
import pytest
import tensorflow as tf

from tfaccel import ops


def numpy_n_step_returns(
    reward, terminated, truncated, truncation_value, bootstrap_value, discount
):
    steps, envs = reward.shape
    returns = np.zeros((steps, envs))
    for b in range(envs):
        next_return = bootstrap_value[b]
        for t in reversed(range(steps)):
            if terminated[t, b]:
                next_value = 0.0
            elif truncated[t, b]:
                next_value = truncation_value[t, b]
            else:
                next_value = next_return
            returns[t, b] = reward[t, b] + discount * next_value
            next_return = returns[t, b]
    return returns


def numpy_generalized_advantage(
    reward, value, bootstrap_value, terminated, truncated, truncation_value, discount, lambda_
):
    steps, envs = reward.shape
    advantages = np.zeros((steps, envs))
    for b in range(envs):
        next_advantage = 0.0
        for t in reversed(range(steps)):
            next_value = bootstrap_value[b] if t == steps - 1 else value[t + 1, b]
            if terminated[t, b]:
                next_value = 0.0
            elif truncated[t, b]:
                next_value = truncation_value[t, b]
            delta = reward[t, b] + discount * next_value - value[t, b]
            ended = terminated[t, b] or truncated[t, b]
            advantages[t, b] = delta + (0.0 if ended else discount * lambda_ * next_advantage)
            next_advantage = advantages[t, b]
    return advantages


def random_rollout(seed, steps=9, envs=6):
    rng = np.random.default_rng(seed)
    terminated = rng.random((steps, envs)) < 0.2
    truncated = rng.random((steps, envs)) < 0.2  # some steps are both: termination wins
    truncation_value = np.where(truncated, rng.normal(size=(steps, envs)), np.nan)
    return dict(
        reward=rng.normal(size=(steps, envs)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        truncation_value=truncation_value.astype(np.float32),  # NaN where unused
        value=rng.normal(size=(steps, envs)).astype(np.float32),
        bootstrap_value=rng.normal(size=envs).astype(np.float32),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("flag_dtype", [bool, np.float32])
def test_n_step_returns_matches_numpy(seed, flag_dtype):
    r = random_rollout(seed)
    terminated, truncated = r["terminated"].astype(flag_dtype), r["truncated"].astype(flag_dtype)
    args = (r["reward"], terminated, truncated, r["truncation_value"])
    returns = ops.n_step_returns(*args, r["bootstrap_value"], 0.9)
    expected = numpy_n_step_returns(*args, r["bootstrap_value"], 0.9)
    assert returns.dtype == tf.float32 and returns.shape == (9, 6)
    np.testing.assert_allclose(returns.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("flag_dtype", [bool, np.float32])
def test_generalized_advantage_matches_numpy(seed, flag_dtype):
    r = random_rollout(seed)
    terminated, truncated = r["terminated"].astype(flag_dtype), r["truncated"].astype(flag_dtype)
    args = (r["reward"], r["value"], r["bootstrap_value"], terminated, truncated)
    advantages = ops.generalized_advantage(*args, r["truncation_value"], 0.9, 0.8)
    expected = numpy_generalized_advantage(*args, r["truncation_value"], 0.9, 0.8)
    assert advantages.dtype == tf.float32 and advantages.shape == (9, 6)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_generalized_advantage_with_lambda_one_is_n_step_return_minus_value():
    r = random_rollout(3)
    flags = (r["terminated"], r["truncated"], r["truncation_value"])
    advantages = ops.generalized_advantage(
        r["reward"], r["value"], r["bootstrap_value"], *flags, 0.9, 1.0
    )
    returns = ops.n_step_returns(r["reward"], *flags, r["bootstrap_value"], 0.9)
    np.testing.assert_allclose(advantages + r["value"], returns, rtol=1e-5, atol=1e-5)


def test_ops_run_inside_tf_function():
    r = random_rollout(4)

    @tf.function(jit_compile=False)
    def compute(reward, terminated, truncated, truncation_value, value, bootstrap_value):
        returns = ops.n_step_returns(
            reward, terminated, truncated, truncation_value, bootstrap_value, 0.9
        )
        advantages = ops.generalized_advantage(
            reward, value, bootstrap_value, terminated, truncated, truncation_value, 0.9, 0.8
        )
        return returns, advantages

    keys = ("reward", "terminated", "truncated", "truncation_value", "value", "bootstrap_value")
    returns, advantages = compute(*(tf.constant(r[key]) for key in keys))
    flags = (r["terminated"], r["truncated"], r["truncation_value"])
    np.testing.assert_allclose(
        returns, numpy_n_step_returns(r["reward"], *flags, r["bootstrap_value"], 0.9), rtol=1e-5
    )
    expected = numpy_generalized_advantage(
        r["reward"], r["value"], r["bootstrap_value"], *flags, 0.9, 0.8
    )
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)


def test_n_step_returns_docstring_example():
    reward = np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]], np.float32)
    terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    truncated = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0]], bool)
    truncation_value = np.array([[0, 0, 0], [0, 0, 10], [0, 0, 0]], np.float32)
    returns = ops.n_step_returns(
        reward, terminated, truncated, truncation_value, np.full(3, 4.0, np.float32), 0.5
    )
    np.testing.assert_array_equal(returns, [[3.25, 2, 4.5], [4.5, 2, 7], [5, 5, 5]])


def test_generalized_advantage_docstring_example():
    reward = np.array([[1, 1, 1], [2, 2, 2], [3, 3, 3]], np.float32)
    value = np.ones((3, 3), np.float32)
    terminated = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0]], bool)
    truncated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    truncation_value = np.array([[0, 0, 0], [0, 10, 0], [0, 0, 0]], np.float32)
    advantages = ops.generalized_advantage(
        reward,
        value,
        np.full(3, 2.0, np.float32),
        terminated,
        truncated,
        truncation_value,
        0.5,
        0.5,
    )
    np.testing.assert_array_equal(advantages, [[1.0625, 2, 0.75], [2.25, 6, 1], [3, 3, 3]])


def test_linear_schedule_docstring_example_and_tensor_steps():
    assert float(ops.linear_schedule(25, 1.0, 0.0, 100)) == 0.75
    assert float(ops.linear_schedule(100, 1.0, 0.0, 100)) == 0.0
    assert float(ops.linear_schedule(150, 1.0, 0.0, 100)) == 0.0  # held at end
    assert float(ops.linear_schedule(0, 1.0, 0.0, 100)) == 1.0
    steps = tf.constant([0, 50, 200], tf.int64)
    np.testing.assert_allclose(ops.linear_schedule(steps, 2.5e-4, 0.0, 100), [2.5e-4, 1.25e-4, 0])
    schedule = tf.function(lambda step: ops.linear_schedule(step, 0.1, 0.05, 10))
    assert float(schedule(tf.constant(5, tf.int64))) == pytest.approx(0.075)


def test_explained_variance_docstring_example():
    result = ops.explained_variance([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 3.0])
    assert float(result) == pytest.approx(0.85)
    assert float(ops.explained_variance([2.0, 2.0], [0.0, 1.0])) == 0.0  # constant target
    assert float(ops.explained_variance([1.0, 3.0], [1.0, 3.0])) == 1.0
