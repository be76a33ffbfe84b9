"""tfaccel's Atari env as one unbatched tf-agents PyEnvironment, for ParallelPyEnvironment.

Only the benchmark's tf-agents peer uses it: ParallelPyEnvironment wants one env per process.
Importing this module imports tf-agents (through the adapter, which prepares its import).
"""

from __future__ import annotations

import functools

from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.tf_agents_adapter import EnvPyEnvironment


def make_atari_py_env(game: str, seed: int) -> EnvPyEnvironment:
    return EnvPyEnvironment(AtariConfig(game=game)(seed))


def constructor(game: str, seed: int = 0):
    """A picklable constructor of one Atari `PyEnvironment` for ParallelPyEnvironment."""
    return functools.partial(make_atari_py_env, game, seed)
