"""Gymnasium envs in the pool: the same trajectories as Gymnasium itself, and clear refusals."""

import gymnasium
import numpy as np
import pytest

from tfaccel.envs.gymnasium_env import GymnasiumConfig
from tfaccel.envs.pool import EnvPool, env_seeds


def test_the_pool_steps_cartpole_as_gymnasium_does():
    config = GymnasiumConfig("CartPole-v1")
    seeds = env_seeds(3, 4)
    direct = [gymnasium.make("CartPole-v1") for _ in seeds]
    expected = np.stack([env.reset(seed=seed)[0] for env, seed in zip(direct, seeds, strict=True)])
    with EnvPool(config, 2, 2, seed=3) as pool:
        assert pool.spec.observation.shape == (4,) and pool.spec.num_actions == 2
        assert pool.spec.observation.dtype == np.float32
        np.testing.assert_array_equal(pool.reset().observation, expected)
        rng, ended = np.random.default_rng(0), 0
        for _ in range(60):
            actions = rng.integers(0, 2, 4).astype(np.int32)
            step = pool.step(actions)
            for i, env in enumerate(direct):
                observation, reward, terminated, truncated, _ = env.step(int(actions[i]))
                assert step.reward[i] == reward and step.terminated[i] == terminated
                if terminated or truncated:  # the pool reset it; its last observation is kept
                    np.testing.assert_array_equal(step.final_observation[i], observation)
                    assert step.game_over[i] and step.game_length[i] == step.game_return[i]
                    observation, _ = env.reset()
                    ended += 1
                np.testing.assert_array_equal(step.observation[i], observation)
        assert ended > 0


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("NoSuchEnv-v0", "cannot make Gymnasium env 'NoSuchEnv-v0'"),
        ("Pendulum-v1", "tfaccel's policies need a Discrete space"),
    ],
)
def test_unusable_envs_are_named(env_id, message):
    with pytest.raises(ValueError, match=message):
        GymnasiumConfig(env_id)(0)
