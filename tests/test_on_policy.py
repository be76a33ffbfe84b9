"""The on-policy trainer's checks of its settings."""

import re
import types

import pytest

from tfaccel import on_policy


@pytest.mark.parametrize(
    "horizon, epochs, minibatches, message",
    [
        (0, 1, 1, "horizon is 0; it must be 1 or more"),
        (5, 0, 1, "epochs is 0; it must be 1 or more"),
        (5, 1, 0, "minibatches is 0; it must be 1 or more"),
        (5, 4, 3, "a rollout of 40 samples per replica (horizon 5 x 8 envs) does not split into 3"),
    ],
)
def test_a_rollout_the_learner_cannot_use_whole_is_named(horizon, epochs, minibatches, message):
    algorithm = types.SimpleNamespace(epochs=epochs, minibatches=minibatches)
    with pytest.raises(ValueError, match=re.escape(message)):
        on_policy._check_rollout(horizon, 8, algorithm)
    on_policy._check_rollout(5, 8, types.SimpleNamespace(epochs=4, minibatches=4))  # 40 = 4 x 10
