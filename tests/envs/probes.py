"""Env factories for pool tests that must be importable by worker processes."""

import dataclasses
import sys

from tfaccel.envs.toy import ScriptedConfig, ScriptedEnv
from tfaccel.types import StepResult


@dataclasses.dataclass(frozen=True)
class ModuleProbeConfig:
    """A scripted env whose reward is 1.0 when `module` is imported in its process, else 0.0."""

    module: str = "tensorflow"

    def __call__(self, seed):
        return ModuleProbeEnv(ScriptedConfig(), seed, self.module)


class ModuleProbeEnv(ScriptedEnv):
    def __init__(self, config, seed, module):
        super().__init__(config, seed)
        self.module = module

    def step(self, action):
        result = super().step(action)
        return StepResult(
            result.observation,
            float(self.module in sys.modules),
            result.terminated,
            result.truncated,
        )


@dataclasses.dataclass(frozen=True)
class FloatFramesConfig:
    """A scripted env whose observations turn float64 (its spec says uint8) from `from_step` on
    (0: from its first reset)."""

    from_step: int = 0

    def __call__(self, seed):
        return FloatFramesEnv(ScriptedConfig(), seed, self.from_step)


class FloatFramesEnv(ScriptedEnv):
    def __init__(self, config, seed, from_step):
        super().__init__(config, seed)
        self.from_step, self.steps = from_step, 0

    def _maybe_float(self, observation):
        return observation / 255.0 if self.steps >= self.from_step else observation

    def reset(self):
        return self._maybe_float(super().reset())

    def step(self, action):
        self.steps += 1
        result = super().step(action)
        return result._replace(observation=self._maybe_float(result.observation))
