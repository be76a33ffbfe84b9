"""Any Gymnasium environment with a discrete action space, as a pool env.

    from tfaccel.envs.gymnasium_env import GymnasiumConfig
    pool = EnvPool(GymnasiumConfig("CartPole-v1"), 2, 8)

or in gin: `train.env = @GymnasiumConfig()` with `GymnasiumConfig.env_id = 'CartPole-v1'`
(`gin_configs/toy/cartpole_ppo.gin`). Box observations go to the network as they are (float32
vectors to `networks.mlp_torso`; uint8 images are scaled to [0, 1]); Gymnasium's `terminated`
and `truncated` (time limits) keep their meaning. A game is one episode, scored in raw reward.

Optional: Gymnasium is not a dependency of tfaccel (`pip install gymnasium`); it is imported in
the workers that build the envs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfaccel.types import ArraySpec, EnvSpec, Game, StepResult


@dataclasses.dataclass(frozen=True)
class GymnasiumConfig:
    """Builds `gymnasium.make(env_id, **kwargs)` envs, each seeded at its first reset.

    Attributes:
        env_id: a registered Gymnasium id, e.g. `CartPole-v1`, `Acrobot-v1`.
        kwargs: keyword arguments of `gymnasium.make`, as (name, value) pairs (hashable).
    """

    env_id: str = "CartPole-v1"
    kwargs: tuple[tuple[str, object], ...] = ()

    def __call__(self, seed: int) -> GymnasiumEnv:
        return GymnasiumEnv(self, seed)


class GymnasiumEnv:
    """See `GymnasiumConfig`."""

    def __init__(self, config: GymnasiumConfig, seed: int):
        try:
            import gymnasium
        except ImportError as error:
            raise ImportError(
                f"GymnasiumConfig needs gymnasium ({error}): pip install gymnasium"
            ) from None
        try:
            self._env = gymnasium.make(config.env_id, **dict(config.kwargs))
        except gymnasium.error.Error as error:
            raise ValueError(f"cannot make Gymnasium env {config.env_id!r}: {error}") from None
        actions, observations = self._env.action_space, self._env.observation_space
        if not isinstance(actions, gymnasium.spaces.Discrete):
            raise ValueError(
                f"{config.env_id} has actions {actions}; tfaccel's policies need a Discrete space"
            )
        if not isinstance(observations, gymnasium.spaces.Box):
            raise ValueError(
                f"{config.env_id} observes {observations}; tfaccel needs one Box of observations"
            )
        dtype = np.dtype(np.uint8 if observations.dtype == np.uint8 else np.float32)
        self.spec = EnvSpec(ArraySpec(tuple(observations.shape), dtype), int(actions.n))
        self._dtype, self._seed, self._start = dtype, seed, int(actions.start)
        self.game = Game()

    def reset(self) -> np.ndarray:
        """Starts a game (the first one with this env's seed)."""
        observation, _ = self._env.reset(seed=self._seed)
        self._seed = None  # later resets continue the env's own random stream
        self.game.start()
        return np.asarray(observation, self._dtype)

    def step(self, action: int) -> StepResult:
        """One Gymnasium step; the game is over at `terminated` or `truncated`."""
        observation, reward, terminated, truncated, _ = self._env.step(self._start + int(action))
        self.game.record(float(reward))
        self.game.over = bool(terminated or truncated)
        return StepResult(
            np.asarray(observation, self._dtype), float(reward), bool(terminated), bool(truncated)
        )

    def close(self) -> None:
        """Closes the Gymnasium env."""
        self._env.close()
