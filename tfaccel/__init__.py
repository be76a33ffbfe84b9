"""tfaccel: fast deep reinforcement learning on Atari with TensorFlow 2 / Keras 3.

    import tfaccel
    run = tfaccel.train("a2c.gin", "runs/a2c_pong")     # see tfaccel.api
    policy = tfaccel.load_policy("runs/a2c_pong/policy")

Importing the package imports no TensorFlow: environment workers import `tfaccel.envs` only, and
`train`, `load_policy` and `Run` load `tfaccel.api` when first used.
"""

import importlib.util
import os

__version__ = "0.1.0"

# tf-agents 0.19 (the tf_agents extra) needs TensorFlow's `tf.keras` to be Keras 2 (tf-keras),
# which TensorFlow >= 2.16 serves only when this is set before tf-agents is imported; where
# tf-agents is installed, `import tfaccel` sets it so the import order does not matter after it.
# tfaccel's own networks import Keras 3 directly and are unaffected (docs/tf_agents.md).
if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_agents") is not None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
__all__ = ["Run", "load_policy", "train"]


def __getattr__(name: str):
    if name in __all__:
        from tfaccel import api

        return getattr(api, name)
    raise AttributeError(f"module 'tfaccel' has no attribute {name!r}")
