"""The samplers against the pool they step: rollouts and replay hold exactly what happened."""

import numpy as np
import pytest

from tfaccel.envs.pool import EnvPool, SerialPool
from tfaccel.envs.toy import ScriptedConfig
from tfaccel.replay import ReplayBuffer
from tfaccel.sampler import ReplaySampler

CONFIG = ScriptedConfig(height=2, width=3, stack=4, life_length=3, lives=2, max_steps=9)


def scripted_policy(log):
    """Actions from the observation's newest pixel (deterministic); logs what it saw."""

    def act(observation, epsilon):
        log.append(observation.copy())
        return (observation[:, 0, 0, -1].astype(np.int64) + int(epsilon * 10)) % 3

    return act


@pytest.mark.parametrize(
    "make_pool",
    [
        lambda: SerialPool(CONFIG, 4, num_groups=2, seed=1),
        lambda: EnvPool(CONFIG, 2, 2, num_groups=2, seed=1),
    ],
)
def test_replay_sampler_stores_every_transition_of_every_group(make_pool):
    seen = []
    with make_pool() as pool:
        replays = [ReplayBuffer(2, 2 * 64, (2, 3), stack=4, n_step=1, seed=0) for _ in range(2)]
        sampler = ReplaySampler(pool, scripted_policy(seen), replays)
        for _ in range(30):
            sampler.step(0.0)
        assert sampler.agent_steps == 30 * 4
        games = sampler.drain_games()
        assert games and all(length <= 9 for _, length in games) and sampler.games == []
    # Each group's buffer holds its 30 steps; every stored observation is one the policy acted on,
    # and each next observation is what that env showed next (or its final frame at an episode end).
    for group, replay in enumerate(replays):
        assert len(replay) > 20
        batch = replay.get(replay.indices())
        acted = np.stack(seen[group::2][:30])  # [30, 2, H, W, C]: the policy's view of the group
        flat = acted.reshape(-1, *acted.shape[2:])
        for observation, action in zip(batch.observation, batch.action, strict=True):
            matches = np.flatnonzero((flat == observation).all(axis=(1, 2, 3)))
            assert matches.size, "a stored observation the policy never saw"
            assert action == (observation[0, 0, -1] % 3)  # the action taken on it
        assert set(np.unique(batch.discount)) <= {0.0, np.float32(0.99)}


def test_replay_sampler_wants_one_buffer_per_group():
    with (
        SerialPool(CONFIG, 4, num_groups=2) as pool,
        pytest.raises(ValueError, match="one replay buffer per group"),
    ):
        ReplaySampler(pool, scripted_policy([]), [ReplayBuffer(4, 64, (2, 3))])
