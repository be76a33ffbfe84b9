"""tfaccel's Atari env as one unbatched tf-agents PyEnvironment, for ParallelPyEnvironment.

Only the benchmark's tf-agents peer uses it: ParallelPyEnvironment wants one env per process.
Importing this module imports tf-agents (through the adapter, which prepares its import).
"""

from __future__ import annotations

import functools

import numpy as np

from tfaccel.envs import tf_agents_adapter  # noqa: F401  (sets TF_USE_LEGACY_KERAS first)
from tfaccel.envs.atari import AtariConfig

# isort: split
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts


class AtariPyEnvironment(py_environment.PyEnvironment):
    """One `AtariEnv` with tf-agents' next-step reset convention."""

    def __init__(self, game: str, seed: int = 0):
        super().__init__()
        self._env = AtariConfig(game=game)(seed)
        shape = self._env.spec.observation.shape
        self._observation_spec = array_spec.BoundedArraySpec(shape, np.uint8, 0, 255)
        self._action_spec = array_spec.BoundedArraySpec(
            (), np.int32, 0, self._env.spec.num_actions - 1
        )

    def observation_spec(self):
        return self._observation_spec

    def action_spec(self):
        return self._action_spec

    def _reset(self):
        return ts.restart(self._env.reset().copy())

    def _step(self, action):
        if self.current_time_step() is not None and self.current_time_step().is_last():
            return self.reset()
        result = self._env.step(int(action))
        observation = result.observation.copy()
        if result.terminated:
            return ts.termination(observation, np.float32(result.reward))
        if result.truncated:
            return ts.truncation(observation, np.float32(result.reward))
        return ts.transition(observation, np.float32(result.reward))


def constructor(game: str, seed: int = 0):
    """A picklable constructor of `AtariPyEnvironment` for ParallelPyEnvironment."""
    return functools.partial(AtariPyEnvironment, game, seed)
