"""The Q-value family of Stooke & Abbeel (2018): DQN, double, dueling, Categorical DQN, eps-Rainbow.

One loss on a `ReplayBatch` of n-step transitions (o_tm1, a_tm1, r_t, d_t, o_t), where r_t is the
n-step return and d_t = gamma^n' * (1 - terminated) comes from the replay:

- DQN (Mnih et al., 2015): Huber loss (delta 1, their error clipping) on the TD error
  `r_t + d_t * max_a Q_target(o_t, a) - Q(o_tm1, a_tm1)`, with a periodically synced target
  network. Differences: n-step targets when the replay is built with n_step > 1, the loss is
  averaged over the batch (with importance weights), and the optimizer is the learner's (the
  paper uses Adam with large batches; Nature DQN used RMSProp).
- Double DQN (van Hasselt et al., 2016), `double=True`: the next action is the argmax of the
  online network on o_t, evaluated by the target network.
- Dueling (Wang et al., 2016): a network option, `networks.QNetwork(dueling=True)`; the loss is
  unchanged.
- Categorical DQN / C51 (Bellemare et al., 2017), `num_atoms=51`: the target distribution of
  `r_t + d_t * Z_target(o_t, a*)` is projected onto the fixed support (`ops.categorical_projection`)
  and the loss is its cross-entropy with the online distribution of a_tm1. a* maximizes the
  expected value (of the target network, or of the online network when `double`). Difference:
  n-step targets when the replay uses them (C51 used one step).
- eps-Rainbow (Stooke & Abbeel, 2018, after Hessel et al., 2018): categorical + double + dueling +
  prioritized replay + 3-step returns, with epsilon-greedy exploration instead of noisy nets.
  Here: `DQNConfig(double=True, num_atoms=51)`, `QNetwork(dueling=True, num_atoms=51)`, and a
  prioritized replay with n_step=3. As in Rainbow, priorities are the per-sample KL divergence
  between the projected target and the online distribution (the cross-entropy minus the target's
  entropy: the same gradient, but zero when the prediction is exact).

The per-sample priorities come back in the metrics under `"priority"` ([N], the only non-scalar
metric): `Learner.train` returns it as a numpy array, and the runner passes it, with `batch.index`,
to `ReplayBuffer.update_priorities` (and does not log it). The target network is `Learner.target`
(`target_network=True`); the learner's loss closes over it and the config.
Optimizer, gradient clipping, target-network sync and the epsilon schedule belong to the learner
and runner; their hyperparameters are documented in `DQNConfig`.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfaccel import ops
from tfaccel.replay import ReplayBatch
from tfaccel.types import check_field_ranges, check_field_types


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """Hyperparameters of the DQN family. Discount and n-step are the replay's (`ReplayBuffer`)."""

    # Double DQN (van Hasselt et al., 2016): select the next action with the online network,
    # evaluate it with the target network. False: plain DQN's max over the target network.
    double: bool = False
    # Atoms of the value distribution: 1 is scalar Q (DQN); 51 is C51 (Bellemare et al., 2017).
    # Must equal the network's `num_atoms`.
    num_atoms: int = 1
    # Support of the categorical distribution, evenly spaced from v_min to v_max. -10 and 10 in
    # Bellemare et al. (2017) and Rainbow, with clipped rewards. Unused when num_atoms == 1.
    v_min: float = -10.0
    v_max: float = 10.0
    # Huber delta of the scalar TD loss. 1.0: the error clipping of Mnih et al. (2015).
    huber_delta: float = 1.0
    # The learner clips the gradient's global norm to this. 10 as in Wang et al. (2016) and
    # rlpyt's DQN (`clip_grad_norm=10`). Read by the learner, not by `loss`.
    max_grad_norm: float = 10.0
    # The learner copies the online weights into the target network every this many agent steps
    # (fired when at least that many passed since the last copy, like every interval counter;
    # docs/architecture.md, "The run directory"). 8000 agent steps as in Dopamine's dqn.gin
    # (2000 updates at one update per 4 steps); Nature DQN: 10,000 updates.
    target_update_period: int = 8000
    # Epsilon-greedy exploration: linear from epsilon_start to epsilon_end over
    # epsilon_decay_steps agent steps, then held (see `epsilon`). 1.0 -> 0.01 over 250,000 agent
    # steps as in Dopamine's dqn.gin and rainbow.gin (Nature DQN: 1.0 -> 0.1 over 1M steps).
    epsilon_start: float = 1.0
    epsilon_end: float = 0.01
    epsilon_decay_steps: int = 250_000
    # Epsilon of evaluation episodes. 0.001 as in Dopamine and Rainbow (Nature DQN: 0.05).
    eval_epsilon: float = 0.001

    def __post_init__(self):
        check_field_types(self)  # a gin binding of the wrong type is named
        check_field_ranges(
            self, num_atoms=(1, None), target_update_period=(1, None), epsilon_start=(0, 1),
            epsilon_end=(0, 1), epsilon_decay_steps=(1, None), eval_epsilon=(0, 1),
            max_grad_norm=(0, None),
        )  # fmt: skip
        if self.num_atoms > 1 and not self.v_min < self.v_max:
            raise ValueError(
                f"DQNConfig.v_min must be below v_max, got {self.v_min!r} and {self.v_max!r}"
            )


def support(config: DQNConfig) -> tf.Tensor:
    """The atoms z_i [num_atoms] of the categorical distribution, v_min to v_max."""
    return tf.linspace(config.v_min, config.v_max, config.num_atoms)


def epsilon(config: DQNConfig, agent_step: int) -> float:
    """The exploration epsilon at `agent_step`, for the runner to pass to `act`: the schedule of
    `ops.linear_schedule` in plain Python, since the sampler asks for it at every step and an
    eager TensorFlow op costs more than the arithmetic."""
    fraction = min(max(agent_step / config.epsilon_decay_steps, 0.0), 1.0)
    return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * fraction


def q_values(output: tf.Tensor, atoms: tf.Tensor | None = None) -> tf.Tensor:
    """Q [B, A] from a `QNetwork` output: itself, or the expected value of logits [B, A, N]."""
    if output.shape.rank == 2:
        return output
    if atoms is None:
        raise ValueError("a categorical network's Q values need the support (atoms)")
    return tf.reduce_sum(tf.nn.softmax(output) * atoms, axis=-1)  # [B, A]


def act(
    network: keras.Model,
    observation: tf.Tensor,
    epsilon: float | tf.Tensor,
    rng: tf.random.Generator | tf.Tensor,
    atoms: tf.Tensor | None = None,
) -> tf.Tensor:
    """Epsilon-greedy on Q (on the expected value for a categorical network), in one batched call.

    Ties go to the lowest action. A pure function of tensors and the generator's state; the
    sampler wraps it in one `tf.function` with a fixed input signature.

    Args:
        network: a `QNetwork` (or any model returning q_values [B, A] or logits [B, A, N]).
        observation: [B, H, W, C] uint8.
        epsilon: probability of a uniformly random action, per env.
        rng: a `tf.random.Generator` (checkpoint it to resume the stream), or an int [2] seed.
        atoms: the support [N] (`support(config)`); required when the network is categorical.

    Returns:
        action [B] int32.
    """
    q = q_values(network(observation), atoms)  # [B, A]
    batch_size, num_actions = tf.shape(q)[0], tf.shape(q)[1]
    if isinstance(rng, tf.random.Generator):
        seed = rng.make_seeds(1)[:, 0]  # [2]
    else:
        seed = tf.convert_to_tensor(rng)
    seeds = tf.random.experimental.stateless_split(seed, 2)  # [2, 2]
    explore = tf.random.stateless_uniform([batch_size], seeds[0]) < epsilon  # [B]
    random_action = tf.random.stateless_uniform(
        [batch_size], seeds[1], maxval=num_actions, dtype=tf.int32
    )  # [B]
    greedy = tf.argmax(q, axis=-1, output_type=tf.int32)  # [B]
    return tf.where(explore, random_action, greedy)


def loss(
    online: keras.Model, batch: ReplayBatch, config: DQNConfig, *, target: keras.Model
) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The DQN-family loss: `mean(weight * per-sample loss)` over the N transitions.

    Per sample: `huber(stop_gradient(y) - Q(o_tm1, a_tm1))` with
    `y = r_t + d_t * Q_target(o_t, a*)` when num_atoms == 1, else the cross-entropy
    `-sum_i m_i log p(o_tm1, a_tm1)_i` with `m = categorical_projection(z, p_target(o_t, a*),
    r_t, d_t)` (no gradient). `a* = argmax_a Q_target(o_t, a)`, or `argmax_a Q(o_t, a)` when
    `config.double` (Q of a distribution: its expected value).

    Args:
        online: the trained `QNetwork`; its output rank must match `config.num_atoms`.
        batch: a `ReplayBatch` (numpy or tensors).
        config: the hyperparameters.
        target: the target network, same architecture; never differentiated. (The signature
            is `types.LossFn`'s: network, batch, config, then what the loss needs besides.)

    Returns:
        `(loss, metrics)`: a float32 scalar; float32 scalar metrics `loss`, `q_mean` (mean
        Q(o_tm1, a_tm1)), `q_std` (its spread over the batch), `target_mean` (mean of y, or of
        the expected value of m), and `priority` [N] float32 >= 0 (|TD error|, or the KL
        divergence of m from the online distribution), for the replay's priorities (see the
        module docstring).
    """
    o_tm1 = tf.convert_to_tensor(batch.observation)  # [N, H, W, C]
    a_tm1 = tf.cast(batch.action, tf.int32)  # [N]
    r_t = tf.cast(batch.reward, tf.float32)  # [N]
    d_t = tf.cast(batch.discount, tf.float32)  # [N]
    o_t = tf.convert_to_tensor(batch.next_observation)  # [N, H, W, C]
    weight = tf.cast(batch.weight, tf.float32)  # [N]
    atoms = support(config) if config.num_atoms > 1 else None  # [N_atoms]

    out_tm1 = online(o_tm1)  # [N, A] or [N, A, N_atoms]
    out_t = tf.stop_gradient(target(o_t))  # [N, A] or [N, A, N_atoms]
    # Double: the online network's own call on o_t, outside the gradient (one call on o_tm1 and
    # o_t together would run the backward pass over both halves, for nothing).
    selector = tf.stop_gradient(online(o_t)) if config.double else out_t
    a_t = tf.argmax(q_values(selector, atoms), axis=-1, output_type=tf.int32)  # [N]

    if config.num_atoms == 1:
        q_tm1 = tf.gather(out_tm1, a_tm1, batch_dims=1)  # [N]
        y = tf.stop_gradient(r_t + d_t * tf.gather(out_t, a_t, batch_dims=1))  # [N]
        td_error = y - q_tm1  # [N]
        per_sample = ops.huber(td_error, config.huber_delta)  # [N]
        priority = tf.abs(td_error)  # [N]
        target_mean = tf.reduce_mean(y)
    else:
        p_t = tf.nn.softmax(tf.gather(out_t, a_t, batch_dims=1))  # [N, N_atoms]
        m = tf.stop_gradient(ops.categorical_projection(atoms, p_t, r_t, d_t))  # [N, N_atoms]
        logits_tm1 = tf.gather(out_tm1, a_tm1, batch_dims=1)  # [N, N_atoms]
        log_p_tm1 = tf.nn.log_softmax(logits_tm1)  # [N, N_atoms]
        per_sample = -tf.reduce_sum(m * log_p_tm1, axis=-1)  # [N] cross-entropy
        target_entropy = -tf.reduce_sum(tf.math.xlogy(m, m), axis=-1)  # [N]
        priority = tf.maximum(per_sample - target_entropy, 0.0)  # [N] KL(m || p)
        q_tm1 = tf.reduce_sum(tf.exp(log_p_tm1) * atoms, axis=-1)  # [N]
        target_mean = tf.reduce_mean(tf.reduce_sum(m * atoms, axis=-1))

    total = tf.reduce_mean(weight * per_sample)
    metrics = {
        "loss": total,
        "q_mean": tf.reduce_mean(q_tm1),
        "q_std": tf.math.reduce_std(q_tm1),
        "target_mean": target_mean,
        "priority": tf.stop_gradient(priority),
    }
    return total, metrics
