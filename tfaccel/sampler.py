"""From the env pool to rollouts: one batched policy call per group step (Stooke & Abbeel, sec. 3).

`OnPolicySampler.rollouts()` yields a [T, B] `Rollout` each time a group has taken T steps. With
two groups the rollout of one group is yielded (and trained on) while the other group steps, as in
the paper's alternating sampler; with one group every yield is synchronous.

The act function is a `tf.function` with a fixed input signature (uint8 [B, H, W, C] frames, or
the env's observations), called once
per group step; its outputs come back as numpy arrays. Game statistics are of full games in raw
score, taken from the pool (`game_over`, `game_return`, `game_length`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from tfaccel.types import Rollout

ActFn = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor, tf.Tensor]]


def compile_act(network, act: Callable, spec, batch_size: int, seed: int = 0, epsilon=False):
    """Wraps an algorithm's act rule as one compiled call with a fixed input signature: the one
    act compiler of both trainers.

    `act(network, observation, generator)` is the policy-gradient rule (`a2c.act`); with
    `epsilon`, `act(network, observation, generator, epsilon)` and the compiled call takes
    epsilon as a second input (a float32 scalar: another value does not retrace).

    Returns `(act_fn, value_fn, generator)`: `act_fn(obs [B, ...][, epsilon])` -> the rule's
    outputs (`(action, log_prob, value)` for the policy-gradient rule, actions for a Q-value
    rule); `value_fn(obs [1, ...]) -> value [1]` for truncation bootstraps (policy-value
    networks); and the `tf.random.Generator` that drives the sampling (checkpoint it to resume
    the random stream).
    """
    generator = tf.random.Generator.from_seed(seed)
    shape, dtype = (batch_size, *spec.observation.shape), tf.as_dtype(spec.observation.dtype)
    signature = [tf.TensorSpec(shape, dtype)] + ([tf.TensorSpec((), tf.float32)] if epsilon else [])

    @tf.function(input_signature=signature, autograph=False)
    def act_fn(observation, *epsilon):
        return act(network, observation, generator, *epsilon)

    @tf.function(
        input_signature=[tf.TensorSpec((1, *spec.observation.shape), dtype)], autograph=False
    )
    def value_fn(observation):
        return network(observation)[1]

    # Traced now, not at the first step: the act rule's gin parameters are then in the
    # operative config, which the run directory keeps and a resume compares.
    act_fn.get_concrete_function()
    return act_fn, value_fn, generator


class _GroupBuffer:
    """The rollout arrays of one group, filled step by step and reused."""

    def __init__(self, horizon: int, batch: int, obs_shape, obs_dtype):
        self.observation = np.zeros((horizon, batch, *obs_shape), obs_dtype)
        self.action = np.zeros((horizon, batch), np.int32)
        self.reward = np.zeros((horizon, batch), np.float32)
        self.terminated = np.zeros((horizon, batch), bool)
        self.truncated = np.zeros((horizon, batch), bool)
        self.truncation_value = np.zeros((horizon, batch), np.float32)
        self.log_prob = np.zeros((horizon, batch), np.float32)
        self.value = np.zeros((horizon, batch), np.float32)
        self.bootstrap_observation = np.zeros((batch, *obs_shape), obs_dtype)
        self.t = 0

    def rollout(self) -> Rollout:
        return Rollout(
            self.observation,
            self.action,
            self.reward,
            self.terminated,
            self.truncated,
            self.truncation_value,
            self.log_prob,
            self.value,
            self.bootstrap_observation,
        )


class OnPolicySampler:
    """Steps a pool with a batched policy and yields [T, B] rollouts, B = the pool's group size.

    Attributes:
        agent_steps: env steps taken so far (all envs).
        games: finished full games as (raw score, agent steps), drained by the caller.
        seconds: wall time spent waiting for envs ("env") and in the policy ("inference").
    """

    def __init__(self, pool, act_fn: ActFn, value_fn, horizon: int):
        self.pool, self.horizon = pool, horizon
        self._act, self._value = act_fn, value_fn
        spec = pool.spec.observation
        self._buffers = [
            _GroupBuffer(horizon, pool.group_size, spec.shape, spec.dtype)
            for _ in range(pool.num_groups)
        ]
        self.agent_steps = 0
        self.games: list[tuple[float, int]] = []
        self.seconds = {"env": 0.0, "inference": 0.0}
        self._started = False

    def _act_and_send(self, group: int, observation: np.ndarray) -> None:
        buffer = self._buffers[group]
        start = time.perf_counter()
        action, log_prob, value = (x.numpy() for x in self._act(observation))
        self.seconds["inference"] += time.perf_counter() - start
        t = buffer.t
        buffer.observation[t] = observation
        buffer.action[t], buffer.log_prob[t], buffer.value[t] = action, log_prob, value
        self.pool.send(action, group)

    def _record(self, group: int, step) -> bool:
        """Stores a group's step results; True when its rollout is complete."""
        buffer, t = self._buffers[group], self._buffers[group].t
        buffer.reward[t] = step.reward
        buffer.terminated[t] = step.terminated
        buffer.truncated[t] = step.truncated
        buffer.truncation_value[t] = 0.0
        for b in np.flatnonzero(step.truncated):  # rare: the time limit of a game
            final = step.final_observation[b : b + 1]
            buffer.truncation_value[t, b] = self._value(final).numpy()[0]
        self.games += finished_games(step)
        self.agent_steps += len(step.reward)
        buffer.t = t + 1
        if buffer.t < self.horizon:
            return False
        buffer.bootstrap_observation[:] = step.observation
        buffer.t = 0
        return True

    def rollouts(self) -> Iterator[tuple[int, Rollout]]:
        """Yields (group, rollout) forever; train on a rollout before asking for the next one."""
        pool = self.pool
        if not self._started:
            pool.reset()
            for group in range(pool.num_groups):
                self._act_and_send(group, pool.view(group).observation)
            self._started = True
        while True:
            for group in range(pool.num_groups):
                start = time.perf_counter()
                step = pool.recv(group)
                self.seconds["env"] += time.perf_counter() - start
                complete = self._record(group, step)
                if complete:
                    yield group, self._buffers[group].rollout()
                self._act_and_send(group, step.observation)

    def drain_games(self) -> list[tuple[float, int]]:
        """(raw score, length) of the games finished since the last call."""
        games, self.games = self.games, []
        return games


def finished_games(step) -> list[tuple[float, int]]:
    """(raw score, agent steps) of the games that ended in `step`; a game whose score is not
    finite (a broken env's NaN reward) is left out of the statistics."""
    ended = np.flatnonzero(step.game_over & np.isfinite(step.game_return))
    return [(float(step.game_return[b]), int(step.game_length[b])) for b in ended]


class ReplaySampler:
    """Steps a pool with a batched epsilon-greedy policy and stores every step in replay.

    One `ReplayBuffer` per group (a buffer's envs step together); `step(epsilon)` steps every group
    once: receive a group's results, store them with the observation and action they came from,
    act on the new observations in one call, send. With two groups, one group's acting and
    storing run while the other group's envs step.

    Attributes:
        agent_steps: env steps taken so far (all envs).
        games: finished full games as (raw score, agent steps), drained by the caller.
        seconds: wall time spent waiting for envs ("env") and in the policy ("inference").
    """

    def __init__(self, pool, act_fn: Callable[[np.ndarray, float], np.ndarray], replays):
        if len(replays) != pool.num_groups:
            raise ValueError(
                f"need one replay buffer per group ({pool.num_groups}), got {len(replays)}"
            )
        self.pool, self.replays, self._act = pool, replays, act_fn
        spec = pool.spec.observation
        self._acted = np.zeros((pool.num_groups, pool.group_size, *spec.shape), spec.dtype)
        self._actions = np.zeros((pool.num_groups, pool.group_size), np.int32)
        self.agent_steps = 0
        self.games: list[tuple[float, int]] = []
        self.seconds = {"env": 0.0, "inference": 0.0}
        self._started = False

    def _act_and_send(self, group: int, observation: np.ndarray, epsilon: float) -> None:
        start = time.perf_counter()
        action = np.asarray(self._act(observation, np.float32(epsilon)))
        self.seconds["inference"] += time.perf_counter() - start
        self._acted[group] = observation
        self._actions[group] = action
        self.pool.send(action, group)

    def step(self, epsilon: float) -> None:
        """One step of every env; each transition goes into its group's replay buffer."""
        pool = self.pool
        if not self._started:
            pool.reset()
            for group in range(pool.num_groups):
                self._act_and_send(group, pool.view(group).observation, epsilon)
            self._started = True
        for group in range(pool.num_groups):
            start = time.perf_counter()
            step = pool.recv(group)
            self.seconds["env"] += time.perf_counter() - start
            self.replays[group].add(
                self._acted[group], self._actions[group], step.reward, step.terminated,
                step.truncated, step.final_observation,
            )  # fmt: skip
            self.games += finished_games(step)
            self.agent_steps += len(step.reward)
            self._act_and_send(group, step.observation, epsilon)

    def drain_games(self) -> list[tuple[float, int]]:
        games, self.games = self.games, []
        return games
