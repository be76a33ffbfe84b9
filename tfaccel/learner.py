"""The generic learner: variables, optimizer, counters, and one compiled train call.

The algorithm is a loss, `loss_fn(network, batch) -> (scalar, metrics)`; the learner owns
everything else (docs/architecture.md, "The learner"): the network and the optimizer slots are
created under the strategy's scope before any checkpoint is built, gradients are clipped by
global norm, and one `tf.function` runs a whole update, so Python is entered once per rollout:
`strategy.run` of one SGD step, or, where the algorithm asks for several (PPO's epochs x
minibatches), a graph loop around it.

Several replicas (`tfaccel.distribute`): each gets an equal share of the batch (split along
`batch_axes`), its loss is scaled by 1 / replicas and the gradients are summed across replicas, so
one update equals the update of one device on the whole batch. Gradients are clipped after the
sum, by the global norm of the whole batch's gradient. Keras's optimizer would sum them across
replicas a second time; `_skip_optimizer_all_reduce` spares that collective where Keras allows.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import keras
import tensorflow as tf

from tfaccel.distribute import strategies
from tfaccel.types import check_range

LossFn = Callable[[keras.Model, object], tuple[tf.Tensor, dict]]

# Where a non-finite value stopped a step (`nonfinite_where`): nowhere, in the loss, or else the
# index of the first trainable variable whose gradient was not finite.
NONFINITE_NONE, NONFINITE_LOSS, NONFINITE_NORM = -2, -1, -3


def make_rmsprop(
    learning_rate, rho: float = 0.99, epsilon: float = 0.1, initial_mean_square: float = 1.0
) -> keras.Optimizer:
    """RMSProp as TensorFlow 1 ran it for PAAC (Clemente et al., 2017: decay 0.99, epsilon 0.1)
    and OpenAI Baselines' A2C (epsilon 1e-5): epsilon inside the square root, the mean square of
    the gradients starting at 1 (`initial_mean_square`; Keras and PyTorch start it at 0).

    From 0, the first step of a weight is lr * g / sqrt((1 - rho) * g**2 + epsilon), about
    1 / sqrt(1 - rho) = 10 times the rate at rho 0.99, and the steps stay above the rate for the
    first few hundred updates; from 1 they start below it.
    """
    check_positive(epsilon, "make_rmsprop.epsilon", "0.1")
    check_range(rho, "make_rmsprop.rho", 0, 1)
    check_range(initial_mean_square, "make_rmsprop.initial_mean_square", 0)
    return RMSpropFrom(initial_mean_square, learning_rate=learning_rate, rho=rho, epsilon=epsilon)


class RMSpropFrom(keras.optimizers.RMSprop):
    """Keras's RMSprop with its mean square of the gradients (`velocity`) starting at
    `initial_mean_square` rather than 0; a checkpoint restores it as Keras's."""

    def __init__(self, initial_mean_square: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.initial_mean_square = float(initial_mean_square)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        # Keras 3's RMSprop makes its mean square here under this name, directly or (in later
        # releases) through add_optimizer_variables; the test checks a first step from 1.
        if name == "velocity":
            initializer = keras.initializers.Constant(self.initial_mean_square)
        return super().add_variable_from_reference(reference_variable, name, initializer)

    def get_config(self) -> dict:
        return {**super().get_config(), "initial_mean_square": self.initial_mean_square}


def make_adam(learning_rate, epsilon: float = 1e-5) -> keras.Optimizer:
    """Adam with epsilon 1e-5 (baselines' PPO and rlpyt's A2C; `make_adam.epsilon` changes it)."""
    check_positive(epsilon, "make_adam.epsilon", "1e-5")
    return FusedAdam(learning_rate=learning_rate, epsilon=epsilon)


class FusedAdam(keras.optimizers.Adam):
    """Keras's Adam, each variable updated by one TensorFlow kernel (`ResourceApplyAdam`).

    The arithmetic is Keras's (the bias correction folded into the step size, epsilon added to
    sqrt(v)), and so are the slots, the checkpoints and the schedules; Keras spells the update as
    seven element-wise passes over the variable and its moments, the kernel as one: 2.04 ms
    against 4.67 ms for the C51 network's 2M parameters on this CPU, ~11% of a batch-32 update
    (`benchmarks/learner_speed.py`). AMSGrad and sparse gradients take Keras's own path.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )


def _handle(variable) -> tf.Tensor:
    """The resource handle of a Keras or TensorFlow variable; of a mirrored one, the handle of the
    copy on the device being updated."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    if isinstance(variable, tf.distribute.DistributedValues):
        variable = variable._get_on_device_or_primary()
    return variable.handle


def check_positive(value, name: str, example: str) -> None:
    """Raises a one-line ValueError unless `value` (bound as `name`) is a positive, finite
    number: a learning rate (a negative one climbs the loss, and 0 trains nothing) or an
    optimizer's epsilon (0 divides by zero where a moment is 0)."""
    valid = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (valid and 0 < value < float("inf")):
        raise ValueError(f"{name} must be a positive number (e.g. {example}), got {value!r}")


def linear_decay(
    learning_rate: float, updates: int
) -> keras.optimizers.schedules.LearningRateSchedule:
    """The learning rate falls linearly to 0 over `updates` optimizer steps (PAAC, A2C, PPO)."""
    return keras.optimizers.schedules.PolynomialDecay(learning_rate, max(int(updates), 1), 0.0)


def warm_up(
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule, updates: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """`learning_rate` (a float or a schedule) scaled by min(1, (step + 1) / `updates`): a linear
    warm-up over the first `updates` optimizer steps, then `learning_rate` as it was; `updates`
    <= 0 returns it unchanged. Adam's first steps move every parameter by the full rate in the
    sign of its gradient; on Atari frames (all pixels >= 0) the weights of a first-layer filter
    mostly share that sign, so a few such steps can push the filter below zero on every input.
    On Pong a warm-up keeps most first-layer channels alive through it, but they are lost later
    at the full rate (benchmarks/results/first_layers/first_layer_survival__*.json)."""
    if updates <= 0:
        return learning_rate
    return _WarmUp(learning_rate, int(updates))


class _WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, learning_rate, updates: int):
        self.learning_rate, self.updates = learning_rate, updates

    def __call__(self, step):
        rate = self.learning_rate(step) if callable(self.learning_rate) else self.learning_rate
        fraction = tf.minimum(1.0, tf.cast(step + 1, tf.float32) / float(self.updates))
        return rate * fraction

    def get_config(self) -> dict:
        return {"learning_rate": self.learning_rate, "updates": self.updates}


def _skip_optimizer_all_reduce(optimizer: keras.Optimizer) -> bool:
    """Makes `optimizer` apply the gradients it gets as they are, without summing them across
    replicas first; False where this Keras has no such step to skip (the learner then divides
    the already summed gradients by the replicas). Keras's TensorFlow optimizer sums in
    `_all_reduce_sum_gradients`; the learner has summed them already, so this halves the traffic
    of every update."""
    if not callable(getattr(type(optimizer), "_all_reduce_sum_gradients", None)):
        return False
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
    return True


def _fault(gradients, bad_loss) -> tf.Tensor:
    """Where a non-finite value stopped a step: the loss, the first variable whose gradient
    (before clipping, which spreads one NaN to every gradient) is not finite, or, with every
    gradient finite, their global norm (too large for float32)."""
    finite = tf.cast(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in gradients]), tf.int32)
    first = tf.argmin(finite, output_type=tf.int32)
    where = tf.where(tf.reduce_all(finite > 0), NONFINITE_NORM, first)
    return tf.where(bad_loss > 0.0, NONFINITE_LOSS, where)


class Learner:
    """Trains `network` with `loss_fn` on batches; see the module docstring.

    Args:
        make_network: builds the Keras model (called under the strategy's scope).
        loss_fn: the algorithm's loss.
        make_optimizer: builds the optimizer (called under the strategy's scope).
        max_grad_norm: gradients are clipped to this global norm (0: no clipping).
        strategy: a `tf.distribute.Strategy` (default: the current one).
        prepare_fn: for several SGD steps per batch (PPO): `(network, batch) -> samples`, a nest
            of tensors with a leading sample axis, computed once before the updates.
        epochs: passes over the prepared samples, each in a new random order.
        minibatches: SGD steps per epoch, each on 1/minibatches of the samples.
        seed: seeds the network's initial weights and the minibatch order (a
            `tf.random.Generator`, checkpointed with the learner). The weights are seeded through
            `keras.utils.set_random_seed`, which also seeds Python's and NumPy's global generators.
        target_network: also keep `target`, a copy of the network that changes only on
            `sync_target()` (the DQN family's target network; the loss closes over it).
        batch_axes: the axis of each array of a batch along which it splits between replicas:
            an int for every array, or a nest like the batch (`Rollout.env_axes()`).

    Metrics: scalars are averaged over replicas; a per-sample metric ([N], e.g. DQN's `priority`
    for prioritized replay) is gathered across replicas and returned as a numpy array.
    """

    def __init__(
        self,
        make_network: Callable[[], keras.Model],
        loss_fn: LossFn,
        make_optimizer: Callable[[], keras.Optimizer],
        max_grad_norm: float = 0.0,
        strategy: tf.distribute.Strategy | None = None,
        prepare_fn: Callable | None = None,
        epochs: int = 1,
        minibatches: int = 1,
        seed: int = 0,
        target_network: bool = False,
        batch_axes=0,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        self._batch_axes = batch_axes
        self._replicas = self.strategy.num_replicas_in_sync
        self._loss_fn, self._max_grad_norm = loss_fn, max_grad_norm
        self._prepare_fn, self._epochs, self._minibatches = prepare_fn, epochs, minibatches
        keras.utils.set_random_seed(seed)  # the initial weights: the same seed, the same network
        with self.strategy.scope():
            # Under a strategy, even of one replica (MirroredStrategy on one GPU), the optimizer
            # synchronizes in apply_gradients, which a replica context cannot branch around.
            self._synchronizing = tf.distribute.has_strategy()
            self.network = make_network()
            self.optimizer = make_optimizer()
            self.optimizer.build(self.network.trainable_variables)
            self.generator = tf.random.Generator.from_seed(seed)
            self.target = make_network() if target_network else None
        self._optimizer_sums = self._replicas > 1 and not _skip_optimizer_all_reduce(self.optimizer)
        if self.target is not None:
            self.sync_target()
        # Traced as written, without AutoGraph (its rewriting of our code and the Keras code it
        # reaches took 5-9 s of a run's start on 2 cores): a loss or network branches on tensors
        # with tf.cond / keras.ops.cond, and loops with tf.while_loop.
        self._train = tf.function(self._update, autograph=False)
        self.last_fault = ""  # where the last skipped step's non-finite value appeared

    def sync_target(self) -> None:
        """Copies the network's weights into the target network."""
        for target, online in zip(self.target.variables, self.network.variables, strict=True):
            target.assign(online)

    def _step(self, batch) -> dict:
        variables = self.network.trainable_variables
        with tf.GradientTape() as tape:
            loss, metrics = self._loss_fn(self.network, batch)
            scaled = loss / self._replicas if self._replicas > 1 else loss
        gradients = tape.gradient(scaled, variables)
        bad_loss = tf.cast(tf.logical_not(tf.math.is_finite(loss)), tf.float32)
        if self._replicas > 1:  # the whole batch's gradient, on every replica
            context = tf.distribute.get_replica_context()  # (and any replica's bad loss)
            *gradients, bad_loss = context.all_reduce(
                tf.distribute.ReduceOp.SUM, [*gradients, bad_loss]
            )
        norm = tf.linalg.global_norm(gradients)
        summed = gradients  # before clipping, which spreads one NaN to every gradient
        if self._max_grad_norm:
            gradients, _ = tf.clip_by_global_norm(gradients, self._max_grad_norm, use_norm=norm)
        if self._optimizer_sums:  # the optimizer sums the replicas' gradients again
            gradients = [gradient / self._replicas for gradient in gradients]
        finite = tf.logical_and(bad_loss == 0.0, tf.math.is_finite(norm))
        if self._synchronizing:  # replicas synchronize in apply: branch in cross-replica context
            where = tf.distribute.get_replica_context().merge_call(
                lambda strategy, *args: self._cross_replica_cond(strategy, *args),
                args=(finite, gradients, summed, bad_loss),
            )
        else:
            where = tf.cond(
                finite, lambda: self._apply(gradients), lambda: _fault(summed, bad_loss)
            )
        skipped = 1.0 - tf.cast(finite, tf.float32)
        return dict(metrics, grad_norm=norm, skipped_updates=skipped, nonfinite_where=where)

    def _apply(self, gradients) -> tf.Tensor:
        self.optimizer.apply_gradients(
            zip(gradients, self.network.trainable_variables, strict=True)
        )
        return tf.constant(NONFINITE_NONE)

    def _cross_replica_cond(self, strategy, finite, gradients, summed, bad_loss):
        """`tf.cond(finite, apply, fault)` for every replica, decided once (`finite` is the same
        on every replica); a replica context cannot branch around the synchronization inside
        `apply`."""
        call = strategy.extended.call_for_each_replica
        return tf.cond(
            strategy.experimental_local_results(finite)[0],
            lambda: call(self._apply, args=(gradients,)),
            lambda: call(_fault, args=(summed, bad_loss)),
        )

    def _update(self, batch) -> dict:
        if self._prepare_fn is None:
            metrics = self.strategy.run(self._step, args=(batch,))
        else:
            metrics = self._sgd_steps(batch)
        return {name: self._across_replicas(value) for name, value in metrics.items()}

    def _sgd_steps(self, batch) -> dict:
        """Epochs x minibatches SGD steps on the prepared samples, each epoch in a new random
        order: one graph loop around `strategy.run` of one step, so one step is traced however
        many steps and replicas there are (a replica context cannot loop around the replicas'
        synchronization itself)."""
        run = self.strategy.run
        samples = run(self._prepare_fn, args=(self.network, batch))
        order = run(self._shuffled, args=(samples,))
        metrics = run(self._first_step, args=(samples, order))

        def body(index, order, metrics):
            return (index + 1, *run(self._next_step, args=(samples, index, order, metrics)))

        steps = self._epochs * self._minibatches
        _, _, metrics = tf.while_loop(
            lambda index, order, metrics: index < steps, body, (tf.constant(1), order, metrics)
        )
        return metrics

    def _shuffled(self, samples) -> tf.Tensor:
        """A random permutation of this replica's samples."""
        return tf.argsort(self.generator.uniform([_count(samples)]))

    def _minibatch(self, samples, index, order):
        """Minibatch `index` of an epoch in `order`."""
        size = _count(samples) // self._minibatches
        start = (index % self._minibatches) * size
        chosen = order[start : start + size]  # [size]
        return tf.nest.map_structure(lambda x: tf.gather(x, chosen), samples)

    def _first_step(self, samples, order) -> dict:
        return self._step(self._minibatch(samples, 0, order))

    def _next_step(self, samples, index, order, metrics):
        """Step `index` (a new permutation at each epoch's start); its metrics, with the skipped
        steps of all steps so far and a fault if any of them had one."""
        new_epoch = index % self._minibatches == 0
        order = tf.cond(new_epoch, lambda: self._shuffled(samples), lambda: order)
        step = self._step(self._minibatch(samples, index, order))
        return order, dict(
            step,
            skipped_updates=metrics["skipped_updates"] + step["skipped_updates"],
            nonfinite_where=tf.maximum(metrics["nonfinite_where"], step["nonfinite_where"]),
        )

    def _across_replicas(self, value):
        """Scalars: the mean over every replica; per-sample metrics: this process's replicas'
        samples in the order of its batch, [N] (another worker's samples are of its own batch)."""
        local = self.strategy.experimental_local_results(value)
        if local[0].shape.rank == 0:
            return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return tf.concat(local, axis=0)

    def train(self, batch) -> dict:
        """One update on `batch` (numpy arrays or tensors); returns scalar metrics as floats and
        per-sample metrics as numpy arrays.

        An SGD step whose loss or gradient is not finite is not applied: `skipped_updates` counts
        such steps of this update, and `last_fault` then says where the first one appeared.
        """
        metrics = self._train(self._distribute(batch))
        where = int(metrics.pop("nonfinite_where"))
        if where != NONFINITE_NONE:
            self.last_fault = {
                NONFINITE_LOSS: "the loss",
                NONFINITE_NORM: "the gradients' global norm (finite gradients, too large to sum)",
            }.get(where) or f"the gradient of {self.network.trainable_variables[where].path}"
        return {
            name: float(value) if value.shape.rank == 0 else value.numpy()
            for name, value in metrics.items()
        }

    def prepare(self, batch):
        """`batch` (numpy) as `train` takes it: as tensors on one replica (several replicas get
        their shares in `train`). A prefetch thread calls it, so the copy into tensors (about
        8% of the training thread's time at batch 32) is not on the training thread."""
        if self._replicas > 1:
            return batch
        return tf.nest.map_structure(tf.convert_to_tensor, batch)

    def _distribute(self, batch):
        """Gives each of this process's replicas its share of `batch` (numpy)."""
        if self._replicas == 1:
            return batch
        count = strategies.local_replicas(self.strategy)
        axes = self._batch_axes
        if isinstance(axes, int):
            axes = tf.nest.map_structure(lambda _: self._batch_axes, batch)

        def share(context):
            index = context.replica_id_in_sync_group % count
            return strategies.shard(batch, index, count, axes)

        return self.strategy.experimental_distribute_values_from_function(share)

    @property
    def learning_rate(self) -> float:
        """The learning rate of the last SGD step taken (of the next one before any): a
        schedule's value one step back, or the constant (a mirrored variable under several
        replicas, which `float` cannot take)."""
        schedule = getattr(self.optimizer, "_learning_rate", None)
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            step = max(int(self.optimizer.iterations.numpy()) - 1, 0)
            return float(keras.ops.convert_to_numpy(schedule(step)))
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))


def _count(samples) -> tf.Tensor | int:
    """The number of samples: static where known, so the loop has fixed shapes."""
    first = tf.nest.flatten(samples)[0]
    return first.shape[0] or tf.shape(first)[0]
