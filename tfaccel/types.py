"""The data vocabulary shared by environments, the pool and (later) the learner.

Environment-side types are numpy only: worker processes import this module and never TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import typing
from typing import Any, NamedTuple, Protocol

import numpy as np


class ArraySpec(NamedTuple):
    """Shape and dtype of one array (without a batch dimension)."""

    shape: tuple[int, ...]
    dtype: np.dtype


class EnvSpec(NamedTuple):
    """What a learner needs to know about an environment: observations and a discrete action set."""

    observation: ArraySpec
    num_actions: int


class StepResult(NamedTuple):
    """One environment step, as returned by `Env.step`.

    `terminated` ends the learning episode with no bootstrap (a lost game or, with episodic life, a
    lost life); `truncated` ends it with a bootstrap from `observation` (the time limit).
    """

    observation: np.ndarray  # [H, W, C], the observation after the step
    reward: float  # the learning reward (sign-clipped where the env is configured so)
    terminated: bool
    truncated: bool


@dataclasses.dataclass
class Game:
    """The full game an env plays, or just ended: statistics are of whole games in raw score.

    A learning episode can be shorter than a game (with episodic life, a lost life ends it), so
    envs keep this record beside their learning rewards, which may be clipped.
    """

    over: bool = True  # the last step ended the game (all lives lost, or the time limit)
    score: float = 0.0  # raw, unclipped score so far
    length: int = 0  # agent steps so far

    def start(self) -> None:
        """Begins a new game: not over, score and length 0."""
        self.over, self.score, self.length = False, 0.0, 0

    def record(self, raw_reward: float) -> None:
        """Adds one agent step with its raw reward to the game."""
        self.score += raw_reward
        self.length += 1


class Env(Protocol):
    """The environment protocol of the pool. Numpy only; one instance per simulator.

    After `step` returns terminated or truncated, the caller calls `reset` before the next `step`.
    `game` describes the current full game; where `game.over`, the step ended it and `game` keeps
    its statistics until the next `reset`.
    """

    spec: EnvSpec
    game: Game

    def reset(self) -> np.ndarray: ...

    def step(self, action: int) -> StepResult: ...

    def close(self) -> None: ...


class PoolStep(NamedTuple):
    """What a pool returns for a group of B envs after a step (views into the pool's buffers).

    Convention (same-step auto-reset): `observation` is what the next action acts on. Where
    `terminated | truncated`, the step ended the learning episode, the env was reset inside the
    worker, `observation` is the first observation of the next episode, and `final_observation`
    holds the last observation of the ended one (for the bootstrap of a truncated episode).
    `game_over` marks the steps that ended a full game (all lives, or the time limit); there
    `game_return` (raw score) and `game_length` (agent steps) describe that game. Fields are only
    meaningful where their flag is set. The arrays are overwritten by the group's next step: copy
    what you keep.
    """

    observation: np.ndarray  # [B, H, W, C]
    reward: np.ndarray  # [B] float32, the learning reward
    terminated: np.ndarray  # [B] bool
    truncated: np.ndarray  # [B] bool
    final_observation: np.ndarray  # [B, H, W, C], where terminated | truncated
    game_over: np.ndarray  # [B] bool
    game_return: np.ndarray  # [B] float64, where game_over
    game_length: np.ndarray  # [B] int64, where game_over


class LossFn(Protocol):
    """The signature every algorithm's loss follows (`a2c.loss`, `ppo.loss`, `dqn.loss`):
    `loss(network, batch, config, **context) -> (loss, metrics)`, with `batch` the learner's
    batch (a `Rollout`, a `PPOBatch` minibatch, a `ReplayBatch`), `config` the algorithm's
    hyperparameters, and keyword-only context that some need (PPO's annealed `clip`, DQN's
    `target` network). `loss` is a float32 scalar; `metrics` maps names to float32 scalars (and
    DQN's `priority` [N])."""

    def __call__(
        self, network: Any, batch: Any, config: Any, /, **context: Any
    ) -> tuple[Any, dict[str, Any]]: ...


class Rollout(NamedTuple):
    """T steps of B envs for an on-policy learner, time-major, as numpy or tensors.

    Step t acted with `action[t]` on `observation[t]` and got `reward[t]`; `terminated[t]` ends
    the episode without a bootstrap, `truncated[t]` with the bootstrap `truncation_value[t]` (the
    value of the episode's final observation, computed by the sampler when it happened).
    `bootstrap_observation` is the observation after the last step, from which the learner
    bootstraps the rollout. `log_prob` and `value` are the behaviour policy's, at acting time.
    """

    observation: np.ndarray  # [T, B, H, W, C] uint8
    action: np.ndarray  # [T, B] int32
    reward: np.ndarray  # [T, B] float32 (learning reward, clipped by the env where configured)
    terminated: np.ndarray  # [T, B] bool
    truncated: np.ndarray  # [T, B] bool
    truncation_value: np.ndarray  # [T, B] float32, meaningful where truncated
    log_prob: np.ndarray  # [T, B] float32, log pi(a_t | o_t) of the behaviour policy
    value: np.ndarray  # [T, B] float32, V(o_t) of the behaviour policy
    bootstrap_observation: np.ndarray  # [B, H, W, C] uint8

    @classmethod
    def env_axes(cls) -> Rollout:
        """The axis of each field that runs over envs (where a batch splits between replicas)."""
        return cls(*([1] * (len(cls._fields) - 1)), bootstrap_observation=0)


@functools.cache
def _field_types(cls: type) -> dict[str, type]:
    return typing.get_type_hints(cls)


def check_spec(spec) -> None:
    """Raises a one-line ValueError unless `spec` (an env's) is an `EnvSpec` of an observation
    `ArraySpec` with a shape of positive ints and a numpy dtype, and one or more actions."""
    valid = "EnvSpec(ArraySpec(shape, dtype), num_actions >= 1) from tfaccel.types"
    if not isinstance(spec, EnvSpec) or not isinstance(spec.observation, ArraySpec):
        raise ValueError(f"an env's spec must be an {valid}, got {spec!r}")
    shape, num_actions = spec.observation.shape, spec.num_actions
    try:
        dtype_ok = np.dtype(spec.observation.dtype) is not None
    except TypeError:
        dtype_ok = False
    sizes_ok = isinstance(shape, (tuple, list)) and all(
        isinstance(n, (int, np.integer)) and n > 0 for n in shape
    )
    count_ok = isinstance(num_actions, (int, np.integer)) and num_actions >= 1
    if not (dtype_ok and sizes_ok and count_ok):
        raise ValueError(f"an env's spec must be an {valid}, got {spec!r}")


def check_field_types(config) -> None:
    """Raises a one-line ValueError naming a field of the dataclass `config` whose value is not
    of its type (`int`, `float`, `bool`, `str` fields; an int is a float; a bool is only a bool),
    as a gin binding of `'4'` for `4` gives; other fields are not checked.
    """
    hints = _field_types(type(config))
    for field in dataclasses.fields(config):
        expected, value = hints.get(field.name), getattr(config, field.name)
        allowed = {int: (int, np.integer), float: (int, float, np.number), bool: (bool, np.bool_),
                   str: (str,)}.get(expected)  # fmt: skip
        if allowed is None:
            continue
        if not isinstance(value, allowed) or (expected is not bool and isinstance(value, bool)):
            kind = {int: "an int", float: "a number", bool: "True or False", str: "a string"}
            raise ValueError(
                f"{type(config).__name__}.{field.name} must be {kind[expected]}, got {value!r} "
                f"({type(value).__name__})"
            )


def check_range(value, name: str, low: float | None = None, high: float | None = None) -> None:
    """Raises a one-line ValueError naming `name` (a gin binding) unless `low <= value <= high`
    (a bound of None is open; NaN is never in range)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if (low is None or value >= low) and (high is None or value <= high):
        return
    if low is not None and high is not None:
        valid = f"between {low:g} and {high:g}"
    else:
        valid = f"at least {low:g}" if low is not None else f"at most {high:g}"
    raise ValueError(f"{name} must be {valid}, got {value!r}")


def check_field_ranges(config, **ranges: tuple[float | None, float | None]) -> None:
    """`check_range` on fields of the dataclass `config`: `discount=(0, 1)` names
    `<Class>.discount` when it is out of [0, 1]."""
    for field, (low, high) in ranges.items():
        check_range(getattr(config, field), f"{type(config).__name__}.{field}", low, high)
