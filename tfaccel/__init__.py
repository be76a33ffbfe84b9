"""tfaccel: fast deep reinforcement learning on Atari with TensorFlow 2 / Keras 3.

    import tfaccel
    run = tfaccel.train("a2c.gin", "runs/a2c_pong")     # see tfaccel.api
    policy = tfaccel.load_policy("runs/a2c_pong/policy")

Importing the package imports no TensorFlow: environment workers import `tfaccel.envs` only, and
`train`, `load_policy` and `Run` load `tfaccel.api` when first used.
"""

__version__ = "0.1.0"
__all__ = ["Run", "load_policy", "train"]


def __getattr__(name: str):
    if name in __all__:
        from tfaccel import api

        return getattr(api, name)
    raise AttributeError(f"module 'tfaccel' has no attribute {name!r}")
