"""The samplers against the pool they step: rollouts and replay hold exactly what happened."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.envs.pool import EnvPool, SerialPool
from tfaccel.envs.toy import ScriptedConfig
from tfaccel.replay import ReplayBuffer
from tfaccel.sampler import OnPolicySampler, ReplaySampler

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


def reference_rollouts(config, seeds, horizon, rollouts, policy):
    """What `OnPolicySampler` must yield for one group, from the envs stepped by hand: per
    rollout, the [T, B] fields, the observation after the last step, and where a step was cut
    by the time limit, the frame it ended on."""
    envs = [config(seed) for seed in seeds]
    observation = np.stack([env.reset() for env in envs])
    result = []
    for _ in range(rollouts):
        fields = {name: [] for name in ("observation", "action", "reward", "terminated",
                                        "truncated", "final")}  # fmt: skip
        for _ in range(horizon):
            action = policy(observation)
            fields["observation"].append(observation.copy())
            fields["action"].append(action)
            steps = [env.step(int(a)) for env, a in zip(envs, action, strict=True)]
            fields["reward"].append([s.reward for s in steps])
            fields["terminated"].append([s.terminated for s in steps])
            fields["truncated"].append([s.truncated for s in steps])
            fields["final"].append([np.array(s.observation) for s in steps])  # a view: copied
            observation = np.stack([
                env.reset() if s.terminated or s.truncated else s.observation
                for env, s in zip(envs, steps, strict=True)
            ])  # fmt: skip
        result.append(({k: np.asarray(v) for k, v in fields.items()}, observation.copy()))
    return result


@pytest.mark.parametrize(
    "make_pool",
    [
        lambda config: SerialPool(config, 4, num_groups=2, seed=3),
        lambda config: EnvPool(config, 2, 2, num_groups=2, seed=3),
    ],
    ids=["serial", "workers"],
)
def test_on_policy_rollouts_hold_what_each_group_did_in_turn(make_pool):
    # Short games (lives of 3-5 steps, 6 steps a game): rollouts of 5 steps see lives end,
    # games end and games cut by the time limit, whose frame the value function bootstraps.
    config = ScriptedConfig(height=2, width=3, stack=4, life_length=3, lives=2, max_steps=6)
    calls = []

    def policy(observation):  # from the newest frame's pixel: deterministic
        return (observation[:, 0, 0, -1].astype(np.int64) * 7 + 1) % 3

    def act_fn(observation):
        observation = np.asarray(observation)
        calls.append(observation.copy())
        pixel = observation[:, 0, 0, -1].astype(np.float32)
        return (tf.constant(policy(observation), tf.int32), tf.constant(-pixel / 100),
                tf.constant(pixel / 10))  # fmt: skip

    def value_fn(final):  # the bootstrap of a truncated step: tells its frame apart
        return tf.constant([1000.0 + float(np.asarray(final)[0, 0, 0, -1])])

    horizon, rounds = 5, 4
    with make_pool(config) as pool:
        sampler = OnPolicySampler(pool, act_fn, value_fn, horizon)
        yielded = []
        for group, rollout in sampler.rollouts():
            yielded.append((group, copied(rollout)))
            if len(yielded) == 2 * rounds:
                break
        seeds = [pool.seeds[g * 2 : g * 2 + 2] for g in range(2)]
        steps, games = sampler.agent_steps, sampler.drain_games()
    # The groups take turns, 0 first; the first two calls act on each group's reset frames.
    assert [group for group, _ in yielded] == [0, 1] * rounds
    assert len(calls) >= 2 * rounds * horizon and steps >= 2 * rounds * horizon * 2
    truncations = 0
    for group in (0, 1):
        expected = reference_rollouts(config, seeds[group], horizon, rounds, policy)
        mine = [rollout for g, rollout in yielded if g == group]
        for rollout, (fields, bootstrap) in zip(mine, expected, strict=True):
            assert rollout.observation.shape == (horizon, 2, 2, 3, 4)  # [T, B, H, W, stack]
            for name in ("observation", "action", "reward", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(rollout, name), fields[name], err_msg=name)
            pixel = fields["observation"][:, :, 0, 0, -1].astype(np.float32)
            np.testing.assert_allclose(rollout.log_prob, -pixel / 100, rtol=1e-6)
            np.testing.assert_allclose(rollout.value, pixel / 10, rtol=1e-6)
            np.testing.assert_array_equal(rollout.bootstrap_observation, bootstrap)
            cut = fields["truncated"]
            final_pixel = fields["final"][:, :, 0, 0, -1].astype(np.float32)
            np.testing.assert_array_equal(
                rollout.truncation_value, np.where(cut, 1000.0 + final_pixel, 0.0)
            )
            truncations += int(cut.sum())
    assert truncations > 0  # the case was exercised
    assert games and all(length == 6 for _, length in games)  # every game: 6 steps (2 lives x 3)


def copied(rollout):
    """A copy of a rollout: the sampler reuses its arrays for the group's next one."""
    return type(rollout)(*(np.array(field, copy=True) for field in rollout))


def test_the_act_rules_gin_parameters_are_in_the_operative_config_once_compiled():
    """A rule's parameter (a temperature, here) was used but missing from operative_config.gin,
    so a resume with another value said nothing: the rule was traced at the first step, after
    the run directory had the config."""
    import gin

    from tfaccel import networks
    from tfaccel.sampler import compile_act
    from tfaccel.types import ArraySpec, EnvSpec

    @gin.configurable("tempered_act", module="tests")
    def tempered_act(network, observation, generator, temperature=1.0):
        logits, value = network(observation)
        action = tf.random.stateless_categorical(logits / temperature, 1, [0, 0])[:, 0]
        return tf.cast(action, tf.int32), logits[:, 0], value

    spec = EnvSpec(ArraySpec((4,), np.float32), 3)
    network = networks.PolicyValueNetwork(spec, torso=networks.mlp_torso)
    network(np.zeros((1, 4), np.float32))
    gin.parse_config("tempered_act.temperature = 1.5")
    compile_act(network, tempered_act, spec, batch_size=2)
    assert "tempered_act.temperature = 1.5" in gin.operative_config_str()
