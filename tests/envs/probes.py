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
