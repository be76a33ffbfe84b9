"""The on-policy trainer's checks of its settings."""

import re
import types

import pytest

from tfaccel import on_policy


class PPOConfig(types.SimpleNamespace):
    """Stands for the algorithm's hyperparameters: the messages name the bindings by its class."""


@pytest.mark.parametrize(
    "horizon, epochs, minibatches, message",
    [
        (0, 1, 1, "train.horizon is 0; it must be 1 or more"),
        (5, 0, 1, "PPOConfig.epochs is 0; it must be 1 or more"),
        (5, 1, 0, "PPOConfig.minibatches is 0; it must be 1 or more"),
        (5, 4, 3, "a rollout of 40 samples per replica (train.horizon 5 x 8 envs: "
                  "PoolConfig.num_workers x envs_per_worker / num_groups) does not split into "
                  "PPOConfig.minibatches = 3: make the rollout a multiple of 3, or choose a "
                  "divisor of 40"),
    ],
)  # fmt: skip
def test_a_rollout_the_learner_cannot_use_whole_is_named(horizon, epochs, minibatches, message):
    algorithm = PPOConfig(epochs=epochs, minibatches=minibatches)
    with pytest.raises(ValueError, match=re.escape(message)):
        on_policy._check_rollout(horizon, 8, 1, algorithm)
    with pytest.raises(ValueError, match=re.escape("(train.horizon 5 x 4 envs: PoolConfig."
                       "num_workers x envs_per_worker / num_groups / 2 replicas)")):  # fmt: skip
        on_policy._check_rollout(5, 8, 2, PPOConfig(epochs=1, minibatches=3))
    on_policy._check_rollout(5, 8, 1, types.SimpleNamespace(epochs=4, minibatches=4))  # 40 = 4 x 10
