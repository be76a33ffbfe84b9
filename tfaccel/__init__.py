"""tfaccel: fast deep reinforcement learning on Atari with TensorFlow 2 / Keras 3.

Importing the package imports no TensorFlow: environment workers import `tfaccel.envs` only.
"""

__version__ = "0.1.0"
