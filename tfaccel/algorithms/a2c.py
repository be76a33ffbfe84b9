"""Synchronous batched advantage actor-critic: PAAC (Clemente et al., 2017) and the A2C of
Stooke & Abbeel (2018, "Accelerated Methods for Deep Reinforcement Learning").

One gradient from a rollout of T steps of B envs (PAAC: T = t_max = 5, B = n_e = 32): n-step
returns bootstrapped from the current network's value of the observation after the rollout, an
advantage-weighted log-likelihood for the policy, a squared error for the value, an entropy bonus.

Differences from the papers:
- A time-limit truncation bootstraps from the value of the ended episode's final observation
  (recorded by the sampler in `Rollout.truncation_value`); PAAC treats every episode end as
  terminal. Terminations (lost games, lost lives with episodic life) do not bootstrap, as there.
- The value term is `value_cost * 0.5 * mean((G - V)^2)` (rlpyt's convention); with value_cost
  0.5 it is PAAC's reference-code critic loss `0.25 * mean((G - V)^2)`.
- The loss is a mean over the T * B samples. PAAC's reference code multiplies its mean loss by
  `loss_scaling = 5` (= t_max, i.e. a sum over time), which its learning rate, RMSProp epsilon 0.1
  and gradient clipping were tuned with; a learner reproducing PAAC scales the loss (or adjusts
  those) accordingly.
- Optimizer, learning rate and gradient clipping belong to the learner; this module only defines
  the loss and the act rule.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfaccel import ops
from tfaccel.types import Rollout, check_field_ranges, check_field_types


@dataclasses.dataclass(frozen=True)
class A2CConfig:
    """Hyperparameters of the A2C loss. Learning rate and optimizer are the learner's."""

    # Discount gamma of the n-step returns. 0.99 in PAAC and Stooke & Abbeel (2018).
    discount: float = 0.99
    # Weight beta of the entropy bonus (subtracted from the loss). 0.01 in A3C and PAAC.
    entropy_cost: float = 0.01
    # Weight of the value term `0.5 * mean((G - V)^2)`. 0.5 as in rlpyt's A2C and PAAC's code.
    value_cost: float = 0.5
    # The learner clips the global norm of the gradient to this value before the update. 40 is
    # the default of PAAC's reference code (`--clip_norm 40`, global); its published Atari runs
    # also used 3.0. Read by the learner, not by `loss`.
    max_grad_norm: float = 40.0
    # PAAC and A3C sum the loss over the t_max steps of each env and average over envs; their
    # learning rates (0.0007 per env, 0.0224 for 32 envs, with RMSProp epsilon 0.1) assume that
    # scale, so True multiplies the loss (not the reported metrics) by T. False: mean over T * B.
    sum_over_time: bool = True

    def __post_init__(self):
        check_field_types(self)  # a gin binding of the wrong type is named
        check_field_ranges(
            self, discount=(0, 1), entropy_cost=(0, None), value_cost=(0, None),
            max_grad_norm=(0, None),
        )  # fmt: skip


def log_prob_and_entropy(logits: tf.Tensor, action: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """log pi(action) and the entropy of a categorical policy.

    Args:
        logits: [N, A] float logits.
        action: [N] int actions.

    Returns:
        `(log_prob [N], entropy [N])`, float32.
    """
    log_policy = tf.nn.log_softmax(logits)  # [N, A]
    log_prob = tf.gather(log_policy, tf.cast(action, tf.int32), batch_dims=1)  # [N]
    entropy = -tf.reduce_sum(tf.exp(log_policy) * log_policy, axis=-1)  # [N]
    return log_prob, entropy


def act(
    network: keras.Model,
    observation: tf.Tensor,
    rng: tf.random.Generator | tf.Tensor | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The act rule of the policy-gradient algorithms: sample from the categorical policy.

    A pure function of tensors (and of the generator's state); the sampler wraps it in one
    `tf.function` with a fixed input signature and calls it once per step of a group of envs.

    Args:
        network: `network(observation) -> (logits [B, A], value [B])`, like `PolicyValueNetwork`.
        observation: [B, H, W, C] uint8.
        rng: where the randomness comes from. A `tf.random.Generator` (checkpoint it to resume the
            random stream) draws one seed per call; an int32/int64 [2] seed tensor makes the
            actions a function of the seed; None uses the stateful `tf.random.categorical`.

    Returns:
        `(action [B] int32, log_prob [B] float32, value [B] float32)`: the sampled action, its
        log-probability and the state value, as recorded in `Rollout`.
    """
    logits, value = network(observation)  # [B, A], [B]
    if isinstance(rng, tf.random.Generator):
        rng = rng.make_seeds(1)[:, 0]  # [2]
    if rng is None:
        action = tf.random.categorical(logits, 1, dtype=tf.int32)[:, 0]  # [B]
    else:
        action = tf.random.stateless_categorical(logits, 1, rng, dtype=tf.int32)[:, 0]  # [B]
    log_prob = tf.gather(tf.nn.log_softmax(logits), action, batch_dims=1)  # [B]
    return action, log_prob, value


def loss(
    network: keras.Model, rollout: Rollout, config: A2CConfig
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The A2C loss of one rollout, averaged over its T * B steps.

    `loss = policy_loss + value_cost * value_loss - entropy_cost * entropy` with
    `policy_loss = -mean(log pi(a_t | o_t) * stop_gradient(G_t - V(o_t)))`,
    `value_loss = 0.5 * mean((G_t - V(o_t))^2)` and `G` from `ops.n_step_returns`, bootstrapped
    from `stop_gradient(V(bootstrap_observation))` and, at truncations, `truncation_value`.
    The rollout's recorded `log_prob` and `value` are not used (the network is run again).

    Args:
        network: `network(observation) -> (logits [N, A], value [N])` on uint8 observations.
        rollout: a `Rollout` (numpy or tensors) with static H, W, C.
        config: the hyperparameters.

    Returns:
        `(loss, metrics)`: a float32 scalar, and float32 scalars `loss`, `policy_loss`,
        `value_loss`, `entropy`, `advantage_mean`, `return_mean`, `value_mean`, `value_std` (its
        spread over the batch; 0 when the network no longer sees its input), and
        `explained_variance`.
    """
    observation = tf.convert_to_tensor(rollout.observation)  # [T, B, H, W, C]
    steps, envs = tf.shape(observation)[0], tf.shape(observation)[1]
    flat_observation = tf.reshape(observation, [-1, *observation.shape[2:]])  # [T*B, H, W, C]
    inputs = tf.concat([flat_observation, rollout.bootstrap_observation], axis=0)  # [T*B+B, ...]
    logits, values = network(inputs)  # [T*B+B, A], [T*B+B]
    num_samples = steps * envs
    value = tf.reshape(values[:num_samples], [steps, envs])  # [T, B]
    bootstrap_value = tf.stop_gradient(values[num_samples:])  # [B]

    returns = ops.n_step_returns(
        rollout.reward,
        rollout.terminated,
        rollout.truncated,
        rollout.truncation_value,
        bootstrap_value,
        config.discount,
    )  # [T, B]
    advantage = returns - value  # [T, B]
    log_prob, entropy = log_prob_and_entropy(
        logits[:num_samples], tf.reshape(rollout.action, [-1])
    )  # [T*B], [T*B]

    policy_loss = -tf.reduce_mean(log_prob * tf.stop_gradient(tf.reshape(advantage, [-1])))
    value_loss = 0.5 * tf.reduce_mean(tf.square(advantage))
    mean_entropy = tf.reduce_mean(entropy)
    total = policy_loss + config.value_cost * value_loss - config.entropy_cost * mean_entropy
    scaled = total * tf.cast(steps, tf.float32) if config.sum_over_time else total
    metrics = {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "advantage_mean": tf.reduce_mean(advantage),
        "return_mean": tf.reduce_mean(returns),
        "value_mean": tf.reduce_mean(value),
        "value_std": tf.math.reduce_std(value),
        "explained_variance": ops.explained_variance(returns, value),
    }
    return scaled, metrics
