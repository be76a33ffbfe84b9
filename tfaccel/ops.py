"""Pure tensor math of the algorithms: returns, advantages, schedules. TensorFlow, float32.

Every function here is a pure function of its tensors, usable eagerly and inside `tf.function`,
and is tested against a slow numpy version in `tests/test_ops.py`, which also checks the worked
example of its docstring. Time-major: `[T, B]` tensors hold T steps of B envs.

Episode ends follow `tfaccel.types.Rollout`: `terminated[t]` ends the episode with no bootstrap,
`truncated[t]` ends it with the bootstrap `truncation_value[t]` (the value of the ended episode's
final observation); where both are set, termination wins. Flags may be bool or float (0/1).
`truncation_value` is read only where `truncated`, so it may hold anything (even NaN) elsewhere.
"""

from __future__ import annotations

import tensorflow as tf


def _next_value(next_step_value, terminated, truncated, truncation_value):
    """The value that step t bootstraps from: 0, truncation_value, or that of step t + 1."""
    zero = tf.zeros_like(next_step_value)
    return tf.where(terminated, zero, tf.where(truncated, truncation_value, next_step_value))


def n_step_returns(
    reward: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    truncation_value: tf.Tensor,
    bootstrap_value: tf.Tensor,
    discount: float | tf.Tensor,
) -> tf.Tensor:
    """Discounted returns of a rollout, bootstrapped at its end and at truncations.

    Backward recursion with `G_T = bootstrap_value`:
    `G_t = r_t + discount * (0 if terminated_t else truncation_value_t if truncated_t else
    G_{t+1})`. This is the n-step return of A3C and PAAC, with n running to the rollout's end.

    Example (T = 3, B = 3, discount 0.5, bootstrap_value 4 in every column, reward [1, 2, 3]
    down every column; column 1 terminates at t = 1; column 2 is truncated at t = 1 with
    truncation_value 10):

        column 0 (no end):        G_2 = 3 + 0.5 * 4 = 5, G_1 = 2 + 0.5 * 5 = 4.5,
                                  G_0 = 1 + 0.5 * 4.5 = 3.25
        column 1 (terminated):    G_2 = 5, G_1 = 2 + 0 = 2,        G_0 = 1 + 0.5 * 2 = 2
        column 2 (truncated):     G_2 = 5, G_1 = 2 + 0.5 * 10 = 7, G_0 = 1 + 0.5 * 7 = 4.5

        returns = [[3.25, 2, 4.5], [4.5, 2, 7], [5, 5, 5]]

    Args:
        reward: [T, B] float rewards.
        terminated: [T, B] bool or float, the step ended the episode without a bootstrap.
        truncated: [T, B] bool or float, the step ended the episode with a bootstrap.
        truncation_value: [T, B] float, the bootstrap value where `truncated`.
        bootstrap_value: [B] float, the value of the observation after the last step.
        discount: the discount factor gamma, a float or scalar tensor.

    Returns:
        [T, B] float32 returns. Gradients flow into `bootstrap_value` unless the caller stops them.
    """
    reward = tf.convert_to_tensor(reward, tf.float32)
    terminated = tf.cast(terminated, tf.bool)
    truncated = tf.cast(truncated, tf.bool)
    truncation_value = tf.convert_to_tensor(truncation_value, tf.float32)
    bootstrap_value = tf.convert_to_tensor(bootstrap_value, tf.float32)
    discount = tf.cast(discount, tf.float32)

    def step(next_return, inputs):  # next_return: [B], G_{t+1}
        r_t, term_t, trunc_t, trunc_value_t = inputs
        return r_t + discount * _next_value(next_return, term_t, trunc_t, trunc_value_t)

    return tf.scan(
        step,
        (reward, terminated, truncated, truncation_value),
        initializer=bootstrap_value,
        reverse=True,
    )  # [T, B]


def generalized_advantage(
    reward: tf.Tensor,
    value: tf.Tensor,
    bootstrap_value: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    truncation_value: tf.Tensor,
    discount: float | tf.Tensor,
    lambda_: float | tf.Tensor,
) -> tf.Tensor:
    """Generalized advantage estimation (Schulman et al., 2016), with episode ends.

    `next_value_t` is `value_{t+1}` (`bootstrap_value` at t = T - 1), replaced by
    `truncation_value_t` where truncated and by 0 where terminated. Then
    `delta_t = r_t + discount * next_value_t - value_t` and, backwards from `A_T = 0`,
    `A_t = delta_t + discount * lambda_ * (1 - (terminated_t or truncated_t)) * A_{t+1}`.
    Value targets are `A + value`. With `lambda_ = 1`, `A + value` equals `n_step_returns`.

    Example (T = 3, B = 3, discount 0.5, lambda_ 0.5, reward [1, 2, 3] and value [1, 1, 1] down
    every column, bootstrap_value 2; column 1 is truncated at t = 1 with truncation_value 10;
    column 2 terminates at t = 1):

        column 0: next_value = [1, 1, 2],  delta = [0.5, 1.5, 3],
                  A_2 = 3, A_1 = 1.5 + 0.25 * 3 = 2.25, A_0 = 0.5 + 0.25 * 2.25 = 1.0625
        column 1: next_value = [1, 10, 2], delta = [0.5, 6, 3],
                  A_2 = 3, A_1 = 6 (cut),             A_0 = 0.5 + 0.25 * 6 = 2
        column 2: next_value = [1, 0, 2],  delta = [0.5, 1, 3],
                  A_2 = 3, A_1 = 1 (cut),             A_0 = 0.5 + 0.25 * 1 = 0.75

        advantages = [[1.0625, 2, 0.75], [2.25, 6, 1], [3, 3, 3]]

    Args:
        reward: [T, B] float rewards.
        value: [T, B] float, V(o_t).
        bootstrap_value: [B] float, the value of the observation after the last step.
        terminated: [T, B] bool or float, the step ended the episode without a bootstrap.
        truncated: [T, B] bool or float, the step ended the episode with a bootstrap.
        truncation_value: [T, B] float, the bootstrap value where `truncated`.
        discount: the discount factor gamma.
        lambda_: the GAE parameter lambda (0: one-step TD error, 1: n-step return - value).

    Returns:
        [T, B] float32 advantages.
    """
    reward = tf.convert_to_tensor(reward, tf.float32)
    value = tf.convert_to_tensor(value, tf.float32)
    bootstrap_value = tf.convert_to_tensor(bootstrap_value, tf.float32)
    terminated = tf.cast(terminated, tf.bool)
    truncated = tf.cast(truncated, tf.bool)
    truncation_value = tf.convert_to_tensor(truncation_value, tf.float32)
    discount = tf.cast(discount, tf.float32)
    lambda_ = tf.cast(lambda_, tf.float32)

    next_step_value = tf.concat([value[1:], bootstrap_value[tf.newaxis]], axis=0)  # [T, B]
    next_value = _next_value(next_step_value, terminated, truncated, truncation_value)  # [T, B]
    delta = reward + discount * next_value - value  # [T, B]
    continues = 1.0 - tf.cast(terminated | truncated, tf.float32)  # [T, B]

    def step(next_advantage, inputs):  # next_advantage: [B], A_{t+1}
        delta_t, continues_t = inputs
        return delta_t + discount * lambda_ * continues_t * next_advantage

    return tf.scan(
        step, (delta, continues), initializer=tf.zeros_like(bootstrap_value), reverse=True
    )  # [T, B]


def linear_schedule(
    step: int | tf.Tensor, start: float, end: float, steps: int | float
) -> tf.Tensor:
    """A value annealed linearly from `start` at step 0 to `end` at `steps`, then held at `end`.

    For learning-rate and clip annealing (PPO anneals both to 0 over training). Negative steps
    give `start`.

    Example: `linear_schedule(25, 1.0, 0.0, 100)` is 0.75; at step 100 or 150 it is 0.0.

    Args:
        step: the current step (any integer or float dtype, or a Python number).
        start: the value at step 0.
        end: the value from `steps` on.
        steps: how many steps the annealing takes (positive).

    Returns:
        A float32 scalar (or a tensor of `step`'s shape).
    """
    fraction = tf.clip_by_value(tf.cast(step, tf.float32) / float(steps), 0.0, 1.0)
    return start + (end - start) * fraction


def explained_variance(target: tf.Tensor, prediction: tf.Tensor) -> tf.Tensor:
    """The fraction of the variance of `target` explained by `prediction`: 1 - Var[t - p] / Var[t].

    1 is a perfect value function, 0 is no better than a constant, negative is worse. Where
    `target` has zero variance the result is 0.

    Example: target [1, 2, 3, 4], prediction [1, 2, 3, 3]: Var[t] = 1.25, t - p = [0, 0, 0, 1]
    with Var = 0.1875, so the result is 1 - 0.1875 / 1.25 = 0.85.

    Args:
        target: float tensor of any shape, the regression targets (e.g. returns).
        prediction: float tensor of the same shape (e.g. values).

    Returns:
        A float32 scalar.
    """
    target = tf.convert_to_tensor(target, tf.float32)
    prediction = tf.convert_to_tensor(prediction, tf.float32)
    target_variance = tf.math.reduce_variance(target)
    residual_variance = tf.math.reduce_variance(target - prediction)
    return tf.where(
        target_variance > 0.0, 1.0 - tf.math.divide_no_nan(residual_variance, target_variance), 0.0
    )


def huber(x: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """The Huber loss of an error: `0.5 * x^2` where `|x| <= delta`, else `delta * (|x| - delta/2)`.

    Its gradient is `x` clipped to [-delta, delta]: with delta 1 it is the error clipping of
    Mnih et al. (2015).

    Example (delta 1): `huber([-3.0, -0.5, 0.0, 1.0, 2.0])` is `[2.5, 0.125, 0.0, 0.5, 1.5]`
    (`1 * (3 - 0.5) = 2.5`, `0.5 * 0.25 = 0.125`, `0.5 * 1 = 0.5`, `1 * (2 - 0.5) = 1.5`).

    Args:
        x: float tensor of any shape, the errors.
        delta: where the loss turns from quadratic to linear (positive).

    Returns:
        float32 tensor of `x`'s shape.
    """
    absolute = tf.abs(tf.convert_to_tensor(x, tf.float32))
    quadratic = tf.minimum(absolute, delta)
    return 0.5 * tf.square(quadratic) + delta * (absolute - quadratic)


def categorical_projection(
    support: tf.Tensor,
    next_probabilities: tf.Tensor,
    reward: tf.Tensor,
    discount: tf.Tensor,
) -> tf.Tensor:
    """Projects the distribution of `reward + discount * Z` onto the fixed support (C51).

    Bellemare et al. (2017), Algorithm 1: each atom z_j, carrying probability p_j, moves to
    `Tz_j = clip(r + discount * z_j, v_min, v_max)`, and its mass is split between the two
    neighbouring atoms of the support in proportion to closeness. Written, as in Dopamine's
    `project_distribution`, as `m_i = sum_j clip(1 - |Tz_j - z_i| / dz, 0, 1) * p_j`, which is
    exact when `Tz_j` lands on an atom. The support must be evenly spaced (dz apart), increasing.

    Example (support [0, 1, 2]):

        p = [0.2, 0.3, 0.5], r = 0.5, discount 0.5: Tz = [0.5, 1.0, 1.5];
            atom 0 gets 0.5 * 0.2 = 0.1, atom 1 gets 0.5 * 0.2 + 0.3 + 0.5 * 0.5 = 0.65,
            atom 2 gets 0.5 * 0.5 = 0.25                       -> [0.1, 0.65, 0.25]
        any p, r = 1.25, discount 0 (terminal): Tz = 1.25 everywhere -> [0, 0.75, 0.25]
        any p, r = 5, discount 0: Tz = 5 clipped to v_max = 2       -> [0, 0, 1]

    Args:
        support: [N_atoms] float, the atoms z_i, evenly spaced from v_min to v_max.
        next_probabilities: [B, N_atoms] float, the distribution to shift (rows sum to 1).
        reward: [B] float, the (n-step) reward.
        discount: [B] float, the bootstrap discount (0 where terminal).

    Returns:
        [B, N_atoms] float32, the projected distribution (rows sum to those of
        `next_probabilities`). Gradients flow unless the caller stops them.
    """
    support = tf.convert_to_tensor(support, tf.float32)
    next_probabilities = tf.convert_to_tensor(next_probabilities, tf.float32)
    reward = tf.convert_to_tensor(reward, tf.float32)
    discount = tf.convert_to_tensor(discount, tf.float32)
    v_min, v_max = support[0], support[-1]
    delta_z = support[1] - support[0]
    target_z = reward[:, None] + discount[:, None] * support[None, :]  # [B, N_j]
    target_z = tf.clip_by_value(target_z, v_min, v_max)  # [B, N_j]
    distance = tf.abs(target_z[:, None, :] - support[None, :, None])  # [B, N_i, N_j]
    closeness = tf.clip_by_value(1.0 - distance / delta_z, 0.0, 1.0)  # [B, N_i, N_j]
    return tf.reduce_sum(closeness * next_probabilities[:, None, :], axis=-1)  # [B, N_i]
