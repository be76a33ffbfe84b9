"""tf-agents environments in the env pool, the env pool as a tf-agents environment, and an
exported tfaccel policy as a tf-agents policy.

All optional (the `tfaccel[tf_agents]` extra):

- `TFAgentsEnvConfig(make_py_env)` turns a factory of tf-agents `PyEnvironment`s into a pool env
  factory, so `EnvPool(TFAgentsEnvConfig(make_py_env), W, M)` steps any tf-agents environment in
  worker processes. `TFAgentsEnv` maps its time steps onto `tfaccel.types.Env`.
- `EnvPyEnvironment(env)` shows one tfaccel env to tf-agents as an unbatched `PyEnvironment`
  (for tf-agents' own `ParallelPyEnvironment`, say).
- `PoolPyEnvironment(pool)` shows an `EnvPool` or `SerialPool` to tf-agents as one batched
  `PyEnvironment` (`batch_size = pool.num_envs`), so tf-agents policies, drivers and metrics run
  against the pool.
- `ExportedPyPolicy(policy_dir)` runs a policy exported by training (`RUN_DIR/policy`) as a
  tf-agents `PyPolicy`, so tf-agents drivers and metrics play it (on `PoolPyEnvironment` or any
  environment with the same observations).

Compared with tf-agents' own `ParallelPyEnvironment`, which gives every env a process and a pipe
and pickles each action and time step through it, the pool steps M envs per worker and moves
observations, rewards and flags through shared memory, with one wake-up byte per worker per step.

Conventions differ at episode ends: the pool auto-resets in the same step (see
`tfaccel.types.PoolStep`), tf-agents on the next step (the step after LAST returns FIRST and
ignores its action). `PoolPyEnvironment` emits LAST with the pool's `final_observation`, then on
the next step holds that env (action -1: not stepped) and emits FIRST with the observation the
pool already reset it to. A tf-agents LAST with discount 0 is our `terminated`, with a discount
above 0 our `truncated` (bootstrapped); LAST from a truncated pool episode has discount 1.

TensorFlow in workers: pool workers normally never import TensorFlow, but `tf_agents` imports it,
so workers running `TFAgentsEnvConfig` envs do (slower starts, more memory per worker). The pool
itself and `PoolPyEnvironment`'s envs (e.g. `AtariConfig`) stay free of it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from tfaccel import policy_client
from tfaccel.types import ArraySpec, Env, EnvSpec, Game, StepResult

# tf-agents 0.19 imports tensorflow-probability 0.23, which needs `tf.keras` to be Keras 2
# (tf-keras); under TF >= 2.16 `tf.keras` is Keras 3 unless this is set before tf_agents is
# imported. Our own code imports Keras 3 as `keras` directly and is unaffected.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

try:
    from tf_agents.environments import py_environment
    from tf_agents.policies import py_policy
    from tf_agents.specs import array_spec
    from tf_agents.trajectories import policy_step
    from tf_agents.trajectories import time_step as ts
except ImportError as error:
    raise ImportError(
        f"tfaccel.envs.tf_agents_adapter needs tf-agents ({error}): "
        "pip install 'tfaccel[tf_agents]' (tf-agents 0.19 installs on Python < 3.12 only)"
    ) from error
except AttributeError as error:  # tf-probability found Keras 3 behind tf.keras
    raise ImportError(
        f"tf-agents could not import ({error}); unset TF_USE_LEGACY_KERAS or set it to 1"
    ) from error


@dataclasses.dataclass(frozen=True)
class TFAgentsEnvConfig:
    """A pool env factory from a factory of tf-agents `PyEnvironment`s; picklable if it is.

    Attributes:
        make_py_env: `seed -> PyEnvironment` (unbatched), defined at module level in an importable
            module (workers import it by name), e.g. a function that builds and seeds the env.
    """

    make_py_env: Callable[[int], py_environment.PyEnvironment]

    def __call__(self, seed: int) -> TFAgentsEnv:
        return TFAgentsEnv(self.make_py_env(seed))


class TFAgentsEnv:
    """One tf-agents `PyEnvironment` as a `tfaccel.types.Env`.

    Our action `a` is the tf-agents action `minimum + a`. A LAST time step ends the game as well as
    the episode: `game.score` is the sum of the raw rewards since `reset`, `game.length` the steps.

    Raises:
        ValueError: the env is batched, its observation spec is not one `ArraySpec`, its action spec
            not a scalar integer `BoundedArraySpec`, or its reward not a scalar.
    """

    def __init__(self, py_env: py_environment.PyEnvironment):
        name = type(py_env).__name__
        if py_env.batched:
            raise ValueError(f"{name} is batched; TFAgentsEnv wraps one unbatched env")
        obs_spec, action_spec = py_env.observation_spec(), py_env.action_spec()
        if not isinstance(obs_spec, array_spec.ArraySpec):
            raise ValueError(
                f"{name} has a nested observation spec ({type(obs_spec).__name__}); "
                "the pool needs a single ArraySpec (flatten or pick one array in a wrapper)"
            )
        if not (
            isinstance(action_spec, array_spec.BoundedArraySpec)
            and action_spec.shape == ()
            and np.issubdtype(action_spec.dtype, np.integer)
        ):
            raise ValueError(
                f"{name} has action spec {action_spec}; the pool needs a scalar integer "
                "BoundedArraySpec (a discrete action set)"
            )
        if py_env.reward_spec().shape != ():
            raise ValueError(f"{name} has reward spec {py_env.reward_spec()}; need a scalar")
        self.py_env = py_env
        self._minimum = int(action_spec.minimum)
        self._action_dtype = action_spec.dtype
        num_actions = int(action_spec.maximum) - self._minimum + 1
        self.spec = EnvSpec(ArraySpec(tuple(obs_spec.shape), np.dtype(obs_spec.dtype)), num_actions)
        self.game = Game()

    def reset(self) -> np.ndarray:
        self.game.start()
        return np.asarray(self.py_env.reset().observation)

    def step(self, action: int) -> StepResult:
        time_step = self.py_env.step(np.asarray(self._minimum + action, self._action_dtype))
        reward = float(time_step.reward)
        self.game.record(reward)
        self.game.over = last = bool(time_step.is_last())
        terminated = last and float(time_step.discount) == 0.0
        return StepResult(
            np.asarray(time_step.observation), reward, terminated, last and not terminated
        )

    def close(self) -> None:
        self.py_env.close()


class EnvPyEnvironment(py_environment.PyEnvironment):
    """One `tfaccel.types.Env` as an unbatched tf-agents `PyEnvironment` (next-step reset).

    For tf-agents tools that want one env per object, such as `ParallelPyEnvironment`.

    Args:
        env: the env; this environment owns it.
        action_minimum: tf-agents action `a` is the env's action `a - action_minimum`.
        action_dtype: dtype of the tf-agents action spec.
    """

    def __init__(self, env: Env, action_minimum: int = 0, action_dtype=np.int32):
        super().__init__(handle_auto_reset=True)
        self._env, self._minimum = env, action_minimum
        obs = env.spec.observation
        self._observation_spec = _observation_spec(obs)
        maximum = action_minimum + env.spec.num_actions - 1
        self._action_spec = array_spec.BoundedArraySpec((), action_dtype, action_minimum, maximum)

    def observation_spec(self) -> array_spec.ArraySpec:
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        return self._action_spec

    def _reset(self) -> ts.TimeStep:
        return ts.restart(self._env.reset().copy())

    def _step(self, action) -> ts.TimeStep:
        result = self._env.step(int(action) - self._minimum)
        observation, reward = result.observation.copy(), np.float32(result.reward)
        if result.terminated:
            return ts.termination(observation, reward)
        if result.truncated:
            return ts.truncation(observation, reward)
        return ts.transition(observation, reward)

    def close(self) -> None:
        self._env.close()


def _observation_spec(obs: ArraySpec) -> array_spec.ArraySpec:
    if np.dtype(obs.dtype) == np.uint8:
        return array_spec.BoundedArraySpec(obs.shape, np.uint8, 0, 255, name="observation")
    return array_spec.ArraySpec(obs.shape, obs.dtype, name="observation")


class PoolPyEnvironment(py_environment.PyEnvironment):
    """An `EnvPool` or `SerialPool` (one group) as a batched tf-agents `PyEnvironment`.

    Actions in: int32 `[num_envs]` in `[0, num_actions)`. Time steps out: FIRST after `reset` and
    on the step after a LAST (reward 0, discount 1, that step's action ignored); LAST where the pool
    ended an episode (discount 0 if terminated, 1 if truncated); MID otherwise. Arrays are copies.
    `get_info()` gives the pool's game statistics of the last step (raw scores, whole games).
    Closing it closes the pool.

    Args:
        pool: an `EnvPool` or `SerialPool` with `num_groups=1`; this environment owns it.

    Raises:
        ValueError: the pool has two groups.
    """

    def __init__(self, pool):
        if pool.num_groups != 1:
            raise ValueError(
                f"PoolPyEnvironment steps all envs at once: use a pool with num_groups=1, "
                f"got {pool.num_groups}"
            )
        super().__init__(handle_auto_reset=False)
        self._pool = pool
        self._observation_spec = _observation_spec(pool.spec.observation)
        self._action_spec = array_spec.BoundedArraySpec(
            (), np.int32, 0, pool.spec.num_actions - 1, name="action"
        )
        self._pending_first = np.zeros(pool.num_envs, bool)  # LAST was emitted: FIRST comes next
        self._info: dict[str, np.ndarray] = {}

    @property
    def batched(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return self._pool.num_envs

    @property
    def pool(self):
        return self._pool

    def observation_spec(self) -> array_spec.ArraySpec:
        return self._observation_spec

    def action_spec(self) -> array_spec.BoundedArraySpec:
        return self._action_spec

    def get_info(self) -> dict[str, np.ndarray]:
        """`game_over` [B] bool, `game_return` [B] float64, `game_length` [B] int64 of the last
        step (the last two meaningful where `game_over`)."""
        return self._info

    def _reset(self) -> ts.TimeStep:
        step = self._pool.reset()
        n = self.batch_size
        self._pending_first[:] = False
        self._info = _game_info(step)
        return ts.TimeStep(
            step_type=np.full(n, ts.StepType.FIRST, np.int32),
            reward=np.zeros(n, np.float32),
            discount=np.ones(n, np.float32),
            observation=step.observation.copy(),
        )

    def _step(self, action) -> ts.TimeStep:
        pending = self._pending_first
        actions = np.where(pending, -1, np.asarray(action).reshape(self.batch_size))
        step = self._pool.step(actions.astype(np.int32))
        ended = step.terminated | step.truncated  # False where held
        observation = step.observation.copy()  # [B, ...]
        observation[ended] = step.final_observation[ended]
        step_type = np.where(ended, ts.StepType.LAST, ts.StepType.MID).astype(np.int32)
        step_type[pending] = ts.StepType.FIRST
        self._pending_first = ended
        self._info = _game_info(step)
        return ts.TimeStep(
            step_type=step_type,
            reward=step.reward.astype(np.float32),  # 0 where held
            discount=np.where(step.terminated, 0.0, 1.0).astype(np.float32),
            observation=observation,
        )

    def close(self) -> None:
        self._pool.close()


def _game_info(step) -> dict[str, np.ndarray]:
    return {
        "game_over": step.game_over.copy(),
        "game_return": step.game_return.copy(),
        "game_length": step.game_length.copy(),
    }


class ExportedPyPolicy(py_policy.PyPolicy):
    """A policy directory written by training, as a tf-agents `PyPolicy`.

    The SavedModel is loaded with `policy_client.load_policy` (TensorFlow alone); actions are its
    `action` output (greedy: the argmax of the logits, or of the expected Q values) or, with
    `sampled`, its `sampled_action` (drawn from the logits; policy-gradient heads only). Time steps
    may be batched (observations [B, H, W, C], actions [B]) or single ([H, W, C], a scalar).

    Args:
        policy_dir: a directory written by `tfaccel.export.export_policy` (`RUN_DIR/policy`).
        sampled: act by sampling the policy's distribution instead of greedily.

    Raises:
        ValueError: the directory is not a loadable tfaccel policy, or `sampled` on a Q head.
    """

    def __init__(self, policy_dir: str, sampled: bool = False):
        self._policy, metadata = policy_client.load_policy(policy_dir)
        if sampled and self._policy.head != "logits":
            raise ValueError(
                f"sampled actions need a policy-gradient policy (head 'logits'); {policy_dir} has "
                f"the head {self._policy.head!r}: use sampled=False"
            )
        self._output = "sampled_action" if sampled else "action"
        observation = array_spec.BoundedArraySpec(
            self._policy.observation_shape, np.uint8, 0, 255, name="observation"
        )
        action = array_spec.BoundedArraySpec(
            (), np.int32, 0, self._policy.num_actions - 1, name="action"
        )
        super().__init__(ts.time_step_spec(observation), action)
        self.metadata = metadata

    def _action(self, time_step: ts.TimeStep, policy_state=()) -> policy_step.PolicyStep:
        observation = np.asarray(time_step.observation)
        single = observation.ndim == len(self._policy.observation_shape)
        batch = observation[None] if single else observation
        action = self._policy(batch)[self._output].astype(np.int32)
        return policy_step.PolicyStep(action[0] if single else action, policy_state, ())
