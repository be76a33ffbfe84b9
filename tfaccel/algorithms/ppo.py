"""Proximal policy optimization with the clipped surrogate (Schulman et al., 2017, "Proximal
Policy Optimization Algorithms"), as run on Atari by Stooke & Abbeel (2018).

The learner runs, per rollout: `prepare` once (GAE advantages and value targets from the values
recorded at acting time), `flatten` to `[T*B]` samples, then `config.epochs` passes over
`config.minibatches` shuffled minibatches, one gradient step of `loss` each. `loss` takes the
current clip range as an argument so the learner can anneal it (the paper anneals the clip range
and the learning rate linearly to 0 over training; `ops.linear_schedule`).

Reference Atari settings (the defaults below): discount 0.99, GAE lambda 0.95, clip 0.1,
entropy 0.01 (Schulman et al., 2017, Table 5); 4 epochs of 4 minibatches (OpenAI baselines'
ppo2 Atari defaults and rlpyt; the paper uses 3 epochs of 32 x 8 = 256 samples out of 8 x 128,
i.e. 4 minibatches). Differences from the paper:
- The value term is `value_cost * 0.5 * mean(err^2)` with value_cost 1.0 (rlpyt); the paper's
  c1 = 1 multiplies an unhalved squared error (value_cost 2.0 here), baselines' ppo2 uses 0.25.
- Advantages are normalized per minibatch by default and value clipping is an option (both from
  baselines' ppo2, not in the paper).
- Truncated episodes bootstrap from `Rollout.truncation_value`, as in `a2c`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import keras
import tensorflow as tf

from tfaccel import ops
from tfaccel.algorithms.a2c import act, log_prob_and_entropy
from tfaccel.types import Rollout, check_field_ranges, check_field_types

__all__ = ["PPOBatch", "PPOConfig", "act", "flatten", "loss", "prepare"]


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of PPO. Learning rate, its schedule and the optimizer are the learner's."""

    # Discount gamma. 0.99 (Schulman et al., 2017, Table 5).
    discount: float = 0.99
    # GAE lambda. 0.95 (Table 5).
    gae_lambda: float = 0.95
    # Initial clip range epsilon of the probability ratio (and of the value change, if clipped).
    # 0.1 on Atari (Table 5: 0.1 * alpha, alpha annealed 1 -> 0); the learner anneals it.
    clip: float = 0.1
    # Passes over each rollout. 4 in baselines' ppo2 and rlpyt (3 in Table 5).
    epochs: int = 4
    # Minibatches per pass; each is (T * B) / minibatches samples. 4 (baselines, rlpyt; Table 5's
    # 256 of 1024). T * B must be divisible by it.
    minibatches: int = 4
    # Weight c2 of the entropy bonus. 0.01 (Table 5).
    entropy_cost: float = 0.01
    # Weight of the value term `0.5 * mean(err^2)`. 1.0 as in rlpyt; Table 5's c1 = 1 on an
    # unhalved squared error is 2.0 here.
    value_cost: float = 1.0
    # Normalize advantages to zero mean and unit standard deviation inside each minibatch
    # (baselines' ppo2).
    normalize_advantage: bool = True
    # Clip the value change to +-clip around the acting-time value and take the larger of the two
    # squared errors (baselines' ppo2). Off by default: it does not help on average (Andrychowicz
    # et al., 2021, "What Matters in On-Policy RL"; Engstrom et al., 2020).
    clip_value: bool = False
    # The learner clips the global gradient norm to this value. 1.0 as in rlpyt (baselines 0.5;
    # the paper does not clip).
    max_grad_norm: float = 1.0

    def __post_init__(self):
        check_field_types(self)  # a gin binding of the wrong type is named
        check_field_ranges(
            self, discount=(0, 1), gae_lambda=(0, 1), clip=(0, None), epochs=(1, None),
            minibatches=(1, None), entropy_cost=(0, None), value_cost=(0, None),
            max_grad_norm=(0, None),
        )  # fmt: skip


class PPOBatch(NamedTuple):
    """A flat minibatch of N samples for `loss`."""

    observation: tf.Tensor  # [N, H, W, C] uint8
    action: tf.Tensor  # [N] int32
    old_log_prob: tf.Tensor  # [N] float32, log pi_old(a | o) at acting time
    old_value: tf.Tensor  # [N] float32, V_old(o) at acting time
    advantage: tf.Tensor  # [N] float32, from `prepare`
    value_target: tf.Tensor  # [N] float32, from `prepare`


def prepare(
    network: keras.Model, rollout: Rollout, config: PPOConfig
) -> tuple[tf.Tensor, tf.Tensor]:
    """GAE advantages and value targets of a rollout, before the epochs of updates.

    Uses the values recorded at acting time (`rollout.value`) and the network's value of
    `rollout.bootstrap_observation`; call it with the parameters that acted. No gradient flows.

    Args:
        network: `network(observation) -> (logits, value)` on uint8 observations.
        rollout: a `Rollout` of T steps of B envs.
        config: the hyperparameters (`discount`, `gae_lambda`).

    Returns:
        `(advantage [T, B], value_target [T, B])`, float32, with `value_target = advantage + value`.
    """
    _, bootstrap_value = network(rollout.bootstrap_observation)  # [B]
    value = tf.convert_to_tensor(rollout.value, tf.float32)  # [T, B]
    advantage = ops.generalized_advantage(
        rollout.reward,
        value,
        tf.stop_gradient(bootstrap_value),
        rollout.terminated,
        rollout.truncated,
        rollout.truncation_value,
        config.discount,
        config.gae_lambda,
    )  # [T, B]
    return advantage, advantage + value


def flatten(rollout: Rollout, advantage: tf.Tensor, value_target: tf.Tensor) -> PPOBatch:
    """All T * B samples of a rollout as one `PPOBatch` (index it with `tf.gather` per minibatch).

    Args:
        rollout: the rollout `prepare` was called on.
        advantage: [T, B] from `prepare`.
        value_target: [T, B] from `prepare`.

    Returns:
        A `PPOBatch` of N = T * B samples, sample `t * B + b` being step t of env b.
    """
    observation = tf.convert_to_tensor(rollout.observation)  # [T, B, H, W, C]
    return PPOBatch(
        observation=tf.reshape(observation, [-1, *observation.shape[2:]]),  # [T*B, H, W, C]
        action=tf.reshape(tf.cast(rollout.action, tf.int32), [-1]),
        old_log_prob=tf.reshape(tf.cast(rollout.log_prob, tf.float32), [-1]),
        old_value=tf.reshape(tf.cast(rollout.value, tf.float32), [-1]),
        advantage=tf.reshape(advantage, [-1]),
        value_target=tf.reshape(value_target, [-1]),
    )


def loss(
    network: keras.Model, batch: PPOBatch, config: PPOConfig, clip: float | tf.Tensor | None = None
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The clipped-surrogate PPO loss of one minibatch.

    `loss = policy_loss + value_cost * value_loss - entropy_cost * entropy` with
    `policy_loss = -mean(min(r * A, clip_by_value(r, 1 - clip, 1 + clip) * A))`,
    `r = exp(log pi(a | o) - old_log_prob)`, and `value_loss = 0.5 * mean((V - target)^2)` or,
    with `clip_value`, `0.5 * mean(max((V - target)^2, (V_clipped - target)^2))` where
    `V_clipped = old_value + clip_by_value(V - old_value, -clip, clip)`.

    Args:
        network: `network(observation) -> (logits [N, A], value [N])` on uint8 observations.
        batch: a `PPOBatch` of N samples.
        config: the hyperparameters.
        clip: the current clip range epsilon (a float or a scalar tensor, for annealing);
            None: `config.clip`.

    Returns:
        `(loss, metrics)`: a float32 scalar, and float32 scalars `loss`, `policy_loss`,
        `value_loss`, `entropy`, `approx_kl` (the estimator mean((r - 1) - log r) of
        KL(pi_old || pi), >= 0), `clip_fraction` (the fraction of samples with |r - 1| > clip),
        `advantage_mean` (before normalization), `value_std` (the values' spread over the
        batch), `explained_variance`.
    """
    clip = tf.cast(config.clip if clip is None else clip, tf.float32)
    logits, value = network(batch.observation)  # [N, A], [N]
    log_prob, entropy = log_prob_and_entropy(logits, batch.action)  # [N], [N]
    advantage = tf.convert_to_tensor(batch.advantage, tf.float32)  # [N]
    if config.normalize_advantage:
        mean, variance = tf.nn.moments(advantage, axes=[0])
        advantage = (advantage - mean) / (tf.sqrt(variance) + 1e-8)  # [N]

    old_log_prob, old_value, value_target = (
        tf.cast(x, tf.float32) for x in (batch.old_log_prob, batch.old_value, batch.value_target)
    )
    log_ratio = log_prob - old_log_prob  # [N]
    ratio = tf.exp(log_ratio)  # [N]
    clipped_ratio = tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip)  # [N]
    policy_loss = -tf.reduce_mean(tf.minimum(ratio * advantage, clipped_ratio * advantage))

    value_error = tf.square(value - value_target)  # [N]
    if config.clip_value:
        clipped_value = old_value + tf.clip_by_value(value - old_value, -clip, clip)  # [N]
        value_error = tf.maximum(value_error, tf.square(clipped_value - value_target))
    value_loss = 0.5 * tf.reduce_mean(value_error)

    mean_entropy = tf.reduce_mean(entropy)
    total = policy_loss + config.value_cost * value_loss - config.entropy_cost * mean_entropy
    metrics = {
        "loss": total,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": mean_entropy,
        "approx_kl": tf.reduce_mean((ratio - 1.0) - log_ratio),
        "clip_fraction": tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > clip, tf.float32)),
        "advantage_mean": tf.reduce_mean(tf.cast(batch.advantage, tf.float32)),
        "value_std": tf.math.reduce_std(value),
        "explained_variance": ops.explained_variance(value_target, value),
    }
    return total, metrics


def samples(network: keras.Model, rollout: Rollout, config: PPOConfig) -> PPOBatch:
    """The learner's `prepare_fn` for PPO: GAE on the whole rollout, then flat samples."""
    advantage, value_target = prepare(network, rollout, config)
    return flatten(rollout, advantage, value_target)
