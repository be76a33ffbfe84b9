"""Tiny deterministic environments for tests and quick learning checks (numpy only).

- `ScriptedConfig`: Atari-shaped (uint8 [H, W, stack]) frames that encode the env's seed and step,
  rewards that depend on the action, lives, a time limit, and injectable faults. For plumbing
  tests: the pool, the samplers, replay.
- `CatchConfig`: the classic catch task on a small image. A correct learner solves it in seconds on
  two cores, which makes it the learning test of every algorithm.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import numpy as np

from tfaccel.envs.frames import FrameStack
from tfaccel.types import ArraySpec, EnvSpec, Game, StepResult, check_field_types


@dataclasses.dataclass(frozen=True)
class ScriptedConfig:
    """A deterministic env whose every number can be checked by hand.

    Frame t of an episode (t = 0 after reset) is filled with `(37 * seed + 11 * episode + t) % 256`.
    The reward of action a at step t is `((t + a) % 3) - 1`. A life lasts `life_length + seed % 3`
    steps and ends with `terminated`; a game has `lives` lives; a game reaching `max_steps` steps is
    `truncated`.

    Attributes:
        height: frame height.
        width: frame width.
        stack: frames per observation.
        num_actions: size of the discrete action set.
        life_length: base number of steps per life.
        lives: lives per game.
        max_steps: agent steps per game before truncation.
        raise_at_step: raise RuntimeError on this (global, 1-based) step of the env (0: never).
        crash_at_step: the process kills itself with SIGKILL on this step (0: never).
        hang_at_step: the step sleeps for an hour (0: never).
        nan_reward_at_step: this step's reward is NaN (0: never), as a broken env's would be.
        faulty_seeds: the faults above hit only envs with these seeds (empty: all envs).
    """

    height: int = 8
    width: int = 6
    stack: int = 4
    num_actions: int = 3
    life_length: int = 7
    lives: int = 2
    max_steps: int = 1000
    raise_at_step: int = 0
    crash_at_step: int = 0
    hang_at_step: int = 0
    nan_reward_at_step: int = 0
    faulty_seeds: tuple[int, ...] = ()

    def __post_init__(self):
        check_field_types(self)  # a gin binding of the wrong type is named

    def __call__(self, seed: int) -> ScriptedEnv:
        return ScriptedEnv(self, seed)


class ScriptedEnv:
    """See `ScriptedConfig`."""

    def __init__(self, config: ScriptedConfig, seed: int):
        self.config = config
        self.seed = seed
        shape = (config.height, config.width, config.stack)
        self.spec = EnvSpec(ArraySpec(shape, np.dtype(np.uint8)), config.num_actions)
        self._stack = FrameStack(config.height, config.width, config.stack)
        self._faulty = not config.faulty_seeds or seed in config.faulty_seeds
        self._steps = 0  # all steps of this env, for fault injection
        self._episode = -1
        self._t = 0
        self._lives_left = 0
        self.game = Game()

    def _frame(self) -> np.ndarray:
        value = (37 * self.seed + 11 * self._episode + self._t) % 256
        return np.full((self.config.height, self.config.width), value, np.uint8)

    def reset(self) -> np.ndarray:
        if self.game.over:
            self._lives_left = self.config.lives
            self.game.start()
        self._episode += 1
        self._t = 0
        self._stack.clear()
        return self._stack.push(self._frame())

    def step(self, action: int) -> StepResult:
        if not 0 <= action < self.config.num_actions:
            raise ValueError(f"action {action} outside [0, {self.config.num_actions})")
        self._steps += 1
        self._inject_faults()
        reward = float((self._t + action) % 3 - 1)
        if self._faulty and self._steps == self.config.nan_reward_at_step:
            reward = float("nan")
        self._t += 1
        self.game.record(reward)
        terminated = self._t >= self.config.life_length + self.seed % 3
        if terminated:
            self._lives_left -= 1
        time_up = self.game.length >= self.config.max_steps
        truncated = not terminated and time_up
        self.game.over = self._lives_left == 0 or time_up
        return StepResult(self._stack.push(self._frame()), reward, terminated, truncated)

    def _inject_faults(self) -> None:
        config, step = self.config, self._steps
        if not self._faulty:
            return
        if step == config.raise_at_step:
            raise RuntimeError(f"scripted fault at step {step}")
        if step == config.crash_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == config.hang_at_step:
            time.sleep(3600)

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class CatchConfig:
    """Catch: a ball falls one row per step; move the paddle (left, stay, right) under it.

    The episode ends when the ball reaches the bottom row, with reward +1 for a catch and -1 for a
    miss. Frames are [(rows + 1) * scale, columns * scale] with ball and paddle at 255 and one
    blank grid row below the paddle: the valid convolutions of `networks.a3c_torso` cover 44 x 20
    pixels exactly, while on 40 rows they never see the last 8, which would hide the paddle.

    Attributes:
        rows: grid rows (the episode lasts rows - 1 steps).
        columns: grid columns.
        scale: pixels per grid cell.
        stack: frames per observation.
        vector: observe float32 [3] (ball row, ball column, paddle column, each scaled to
            [0, 1]) instead of frames: an env of vector observations (`networks.mlp_torso`).
    """

    rows: int = 10
    columns: int = 5
    scale: int = 4
    stack: int = 1
    vector: bool = False

    def __post_init__(self):
        check_field_types(self)  # a gin binding of the wrong type is named

    def __call__(self, seed: int) -> CatchEnv:
        return CatchEnv(self, seed)


class CatchEnv:
    """See `CatchConfig`. A game is one episode."""

    def __init__(self, config: CatchConfig, seed: int):
        self.config = config
        height, width = (config.rows + 1) * config.scale, config.columns * config.scale
        frames = ArraySpec((height, width, config.stack), np.dtype(np.uint8))
        vector = ArraySpec((3,), np.dtype(np.float32))
        self.spec = EnvSpec(vector if config.vector else frames, 3)
        self._rng = np.random.default_rng(seed)
        self._stack = FrameStack(height, width, config.stack)
        self._frame = np.zeros((height, width), np.uint8)
        self._ball_row = self._ball_col = self._paddle = 0
        self.game = Game()

    def _render(self) -> np.ndarray:
        if self.config.vector:
            rows, columns = self.config.rows - 1, self.config.columns - 1
            position = (self._ball_row / rows, self._ball_col / columns, self._paddle / columns)
            return np.array(position, np.float32)
        s, frame = self.config.scale, self._frame
        frame.fill(0)
        frame[
            self._ball_row * s : (self._ball_row + 1) * s,
            self._ball_col * s : (self._ball_col + 1) * s,
        ] = 255
        bottom = (self.config.rows - 1) * s
        frame[bottom : bottom + s, self._paddle * s : (self._paddle + 1) * s] = 255
        return self._stack.push(frame)

    def reset(self) -> np.ndarray:
        self._ball_row = 0
        self._ball_col = int(self._rng.integers(self.config.columns))
        self._paddle = self.config.columns // 2
        self.game.start()
        self._stack.clear()
        return self._render()

    def step(self, action: int) -> StepResult:
        self._paddle = int(np.clip(self._paddle + action - 1, 0, self.config.columns - 1))
        self._ball_row += 1
        reward = 0.0
        if self._ball_row == self.config.rows - 1:
            reward = 1.0 if self._paddle == self._ball_col else -1.0
            self.game.over = True
        self.game.record(reward)
        return StepResult(self._render(), reward, self.game.over, False)

    def close(self) -> None:
        pass
