"""The tf-agents adapter: tf-agents envs in the pool, and the pool as a batched tf-agents env.

Worker processes import this module by name to build scripted tf-agents envs, so everything they
need is defined at module level.
"""

import sys

import keras
import numpy as np
import pytest

if sys.version_info >= (3, 12):  # make test installs tfaccel[tf_agents] where it can install
    pytest.skip("tf-agents 0.19 installs on Python < 3.12 only", allow_module_level=True)

# The adapter sets TF_USE_LEGACY_KERAS, which tf_agents needs before its first import.
from tfaccel.envs.tf_agents_adapter import (
    EnvPyEnvironment,
    ExportedPyPolicy,
    PoolPyEnvironment,
    TFAgentsEnv,
    TFAgentsEnvConfig,
)

# isort: split
from tf_agents.drivers import py_driver
from tf_agents.environments import batched_py_environment, py_environment, random_py_environment
from tf_agents.environments import utils as env_utils
from tf_agents.metrics import py_metrics
from tf_agents.policies import random_py_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from tests.envs.probes import ModuleProbeConfig
from tfaccel import export, policy_client
from tfaccel.envs.pool import EnvPool, PoolError, SerialPool
from tfaccel.envs.toy import CatchConfig, ScriptedConfig
from tfaccel.networks import PolicyValueNetwork, QNetwork, a3c_torso
from tfaccel.types import ArraySpec, EnvSpec

pytestmark = pytest.mark.tf_agents

FIRST, MID, LAST = (int(t) for t in (ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST))

# Lives of 3..5 steps (3 + seed % 3), two per game, games cut at 7 steps: a seed with seed % 3 == 0
# ends both lives by termination (3 + 3 < 7), the others are truncated in their second life.
SCRIPTED = ScriptedConfig(height=2, width=3, stack=2, life_length=3, lives=2, max_steps=7)
ACTION_MINIMUM = 2  # make_scripted_py_env's actions are 2, 3, 4: TFAgentsEnv must shift them


def make_scripted_py_env(seed: int) -> EnvPyEnvironment:
    """`ScriptedEnv` as a tf-agents env: a lost life is a termination, the time limit a truncation
    (discount 1); a step after LAST resets (tf-agents' convention); actions 2, 3, 4 (int64)."""
    return EnvPyEnvironment(SCRIPTED(seed), action_minimum=ACTION_MINIMUM, action_dtype=np.int64)


class ScriptedReference:
    """`ScriptedConfig`'s docstring as tf-agents time steps of one env, by hand (next-step reset).

    Frame t of episode e is `(37 * seed + 11 * e + t) % 256`, stacked oldest first with zeros
    before t = 0; the reward of action a at step t is `((t + a) % 3) - 1`.
    """

    def __init__(self, config: ScriptedConfig, seed: int):
        self.config, self.seed = config, seed
        self.episode, self.t, self.lives, self.game_length = -1, 0, 0, 0
        self.last = False

    def observation(self) -> np.ndarray:
        c = self.config
        times = [self.t - k for k in reversed(range(c.stack))]  # oldest first
        frames = [(37 * self.seed + 11 * self.episode + t) % 256 if t >= 0 else 0 for t in times]
        return np.broadcast_to(np.array(frames, np.uint8), (c.height, c.width, c.stack))

    def reset(self) -> tuple:
        if self.lives == 0 or self.game_length >= self.config.max_steps:  # a new game
            self.lives, self.game_length = self.config.lives, 0
        self.episode, self.t, self.last = self.episode + 1, 0, False
        return FIRST, 0.0, 1.0, self.observation()

    def step(self, action: int) -> tuple:
        if self.last:
            return self.reset()  # the action is ignored
        reward = (self.t + action) % 3 - 1
        self.t, self.game_length = self.t + 1, self.game_length + 1
        terminated = self.t >= self.config.life_length + self.seed % 3
        self.lives -= terminated
        truncated = not terminated and self.game_length >= self.config.max_steps
        self.last = terminated or truncated
        return (LAST if self.last else MID), reward, 0.0 if terminated else 1.0, self.observation()


def expected_time_step(rows: list[tuple]) -> ts.TimeStep:
    step_type, reward, discount, observation = zip(*rows, strict=True)
    return ts.TimeStep(
        np.array(step_type, np.int32),
        np.array(reward, np.float32),
        np.array(discount, np.float32),
        np.stack(observation),
    )


def assert_time_steps_equal(a: ts.TimeStep, b: ts.TimeStep) -> None:
    for field in ts.TimeStep._fields:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def batched_spec(env: py_environment.PyEnvironment) -> ts.TimeStep:
    return array_spec.add_outer_dims_nest(env.time_step_spec(), (env.batch_size,))


def test_tf_agents_envs_in_the_pool_match_stepping_them_by_hand():
    rng = np.random.default_rng(0)
    with EnvPool(TFAgentsEnvConfig(make_scripted_py_env), 2, 2, seed=3) as pool:
        assert pool.spec == EnvSpec(ArraySpec((2, 3, 2), np.dtype(np.uint8)), 3)
        envs = [make_scripted_py_env(seed) for seed in pool.seeds]
        observation = pool.reset().observation
        np.testing.assert_array_equal(observation, [env.reset().observation for env in envs])
        game_returns, game_lengths = [0.0] * 4, [0] * 4
        ends = {"terminated": 0, "truncated": 0}
        for _ in range(30):
            actions = rng.integers(0, 3, 4)
            step = pool.step(actions)
            for i, env in enumerate(envs):
                time_step = env.step(np.int64(ACTION_MINIMUM + actions[i]))
                game_returns[i] += float(time_step.reward)
                game_lengths[i] += 1
                last = bool(time_step.is_last())
                assert step.reward[i] == time_step.reward
                assert step.terminated[i] == (last and time_step.discount == 0.0)
                assert step.truncated[i] == (last and time_step.discount == 1.0)
                assert step.game_over[i] == last
                if last:  # the pool reset the env in the same step: do it by hand
                    np.testing.assert_array_equal(step.final_observation[i], time_step.observation)
                    assert step.game_return[i] == game_returns[i]
                    assert step.game_length[i] == game_lengths[i]
                    ends["terminated" if step.terminated[i] else "truncated"] += 1
                    time_step = env.reset()
                    game_returns[i], game_lengths[i] = 0.0, 0
                np.testing.assert_array_equal(step.observation[i], time_step.observation)
        assert ends["terminated"] and ends["truncated"], ends


def test_pool_of_tf_agents_envs_as_tf_agents_env_equals_batching_them_in_process():
    """The round trip tf-agents env -> pool -> tf-agents env is the identity (actions shifted).

    A `SerialPool` runs the pool's stepping code without the seconds a worker needs to import
    TensorFlow; the test above covers workers.
    """
    rng = np.random.default_rng(1)
    with PoolPyEnvironment(SerialPool(TFAgentsEnvConfig(make_scripted_py_env), 4)) as env:
        reference = batched_py_environment.BatchedPyEnvironment(
            [make_scripted_py_env(seed) for seed in env.pool.seeds], multithreading=False
        )
        assert_time_steps_equal(env.reset(), reference.reset())
        step_types = set()
        for _ in range(30):
            actions = rng.integers(0, 3, 4).astype(np.int32)
            time_step = env.step(actions)
            assert_time_steps_equal(time_step, reference.step(ACTION_MINIMUM + actions))
            step_types.update(
                zip(time_step.step_type.tolist(), time_step.discount.tolist(), strict=True)
            )
        assert step_types == {(FIRST, 1.0), (MID, 1.0), (LAST, 0.0), (LAST, 1.0)}


def test_pool_as_tf_agents_env_matches_serial_pool_and_hand_computed_time_steps():
    rng = np.random.default_rng(2)
    with (
        PoolPyEnvironment(EnvPool(SCRIPTED, 2, 2, seed=3)) as env,
        PoolPyEnvironment(SerialPool(SCRIPTED, 4, seed=3)) as serial,
    ):
        assert env.batched and env.batch_size == serial.batch_size == 4
        assert env.action_spec() == array_spec.BoundedArraySpec((), np.int32, 0, 2)
        assert env.observation_spec() == array_spec.BoundedArraySpec((2, 3, 2), np.uint8, 0, 255)
        spec = batched_spec(env)
        references = [ScriptedReference(SCRIPTED, seed) for seed in env.pool.seeds]
        expected = expected_time_step([r.reset() for r in references])
        for time_step in (env.reset(), serial.reset()):
            assert_time_steps_equal(time_step, expected)
        previous = expected.step_type
        counts = {"terminated": 0, "truncated": 0, "first_after_last": 0}
        for _ in range(40):
            actions = rng.integers(0, 3, 4).astype(np.int32)
            # Envs that just emitted LAST must ignore their action: give the serial twin another.
            other = np.where(previous == LAST, (actions + 1) % 3, actions).astype(np.int32)
            time_step = env.step(actions)
            assert array_spec.check_arrays_nest(time_step, spec)
            assert_time_steps_equal(time_step, serial.step(other))
            expected = expected_time_step(
                [r.step(int(a)) for r, a in zip(references, actions, strict=True)]
            )
            assert_time_steps_equal(time_step, expected)

            step_type, reward, discount = time_step.step_type, time_step.reward, time_step.discount
            np.testing.assert_array_equal(step_type == FIRST, previous == LAST)
            assert np.all(reward[step_type == FIRST] == 0.0)
            assert np.all(discount[step_type != LAST] == 1.0)
            counts["first_after_last"] += int(np.sum(step_type == FIRST))
            counts["terminated"] += int(np.sum((step_type == LAST) & (discount == 0.0)))
            counts["truncated"] += int(np.sum((step_type == LAST) & (discount == 1.0)))
            previous = step_type
        assert all(counts.values()), counts


def test_pool_env_passes_tf_agents_validation():
    with PoolPyEnvironment(SerialPool(SCRIPTED, 4, seed=5)) as env:
        env_utils.validate_py_environment(env, episodes=12)


def test_tf_agents_driver_policy_and_metrics_run_on_the_pool():
    with PoolPyEnvironment(EnvPool(CatchConfig(), 2, 2, seed=1)) as env:
        policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=0)
        average_return = py_metrics.AverageReturnMetric(batch_size=4, buffer_size=1000)
        average_length = py_metrics.AverageEpisodeLengthMetric(batch_size=4, buffer_size=1000)
        episodes = py_metrics.NumberOfEpisodes()
        trajectories, infos = [], []
        driver = py_driver.PyDriver(
            env,
            policy,
            observers=[average_return, average_length, episodes, trajectories.append],
            info_observers=[infos.append],
            max_steps=4 * 45,
        )
        time_step, _ = driver.run(env.reset())
        assert time_step.step_type.shape == (4,)

    is_last = np.stack([t.is_last() for t in trajectories])  # [T, B]
    rewards = np.stack([t.reward for t in trajectories])  # [T, B]
    game_over = np.stack([i["game_over"] for i in infos])  # [T, B]
    game_return = np.stack([i["game_return"] for i in infos])  # [T, B]
    # A catch episode is 9 steps and one game; its only reward, +1 or -1, comes with its LAST.
    assert episodes.result() == is_last.sum() >= 16
    assert set(rewards[is_last].tolist()) <= {-1.0, 1.0}
    assert average_return.result() == pytest.approx(rewards[is_last].mean())
    assert average_length.result() == 9.0
    np.testing.assert_array_equal(game_over, is_last)
    np.testing.assert_array_equal(game_return[is_last], rewards[is_last])


def test_nested_observation_spec_is_rejected_by_name():
    py_env = random_py_environment.RandomPyEnvironment(
        {
            "frame": array_spec.ArraySpec((2,), np.float32),
            "lives": array_spec.ArraySpec((), np.int32),
        },
        array_spec.BoundedArraySpec((), np.int32, 0, 2),
    )
    with pytest.raises(ValueError, match="nested observation spec.*single ArraySpec"):
        TFAgentsEnv(py_env)


def test_continuous_action_spec_is_rejected_by_name():
    py_env = random_py_environment.RandomPyEnvironment(
        array_spec.ArraySpec((2,), np.float32),
        array_spec.BoundedArraySpec((), np.float32, -1.0, 1.0),
    )
    with pytest.raises(ValueError, match="scalar integer BoundedArraySpec"):
        TFAgentsEnv(py_env)


def test_two_group_pool_is_rejected_and_closing_the_env_closes_the_pool():
    with pytest.raises(ValueError, match="num_groups=1"):
        PoolPyEnvironment(SerialPool(SCRIPTED, 4, num_groups=2))
    env = PoolPyEnvironment(EnvPool(SCRIPTED, 1, 2))
    env.reset()
    env.close()
    with pytest.raises(PoolError, match="closed"):
        env.pool.step(np.zeros(2, np.int32))


def test_pool_env_keeps_tensorflow_out_of_workers_of_numpy_envs():
    with PoolPyEnvironment(EnvPool(ModuleProbeConfig("tensorflow"), 1, 2)) as env:
        env.reset()
        reward = env.step(np.zeros(2, np.int32)).reward  # 1.0 where the worker imported TF
    np.testing.assert_array_equal(reward, [0.0, 0.0])


@pytest.fixture(scope="module")
def catch_policy(tmp_path_factory):
    """A Catch policy network whose greedy actions vary over `observation` (the first seed
    that gives a random network such variety), exported as training exports it."""
    spec = CatchConfig()(0).spec
    observation = np.random.default_rng(0).integers(0, 256, (32, *spec.observation.shape))
    observation = observation.astype(np.uint8)
    for seed in range(50):
        keras.utils.set_random_seed(seed)
        network = PolicyValueNetwork(spec)
        kernel = network.policy_head.kernel
        kernel.assign(np.random.default_rng(seed).normal(0, 5.0, kernel.shape).astype(np.float32))
        if len(set(network(observation)[0].numpy().argmax(-1).tolist())) > 1:
            break
    path = str(tmp_path_factory.mktemp("run") / "policy")
    export.export_policy(network, None, path)
    return network, path, observation


def test_exported_policy_acts_like_the_network_and_the_client(catch_policy):
    network, path, observation = catch_policy
    policy = ExportedPyPolicy(path)
    client, _ = policy_client.load_policy(path)
    greedy = network(observation)[0].numpy().argmax(-1)
    assert len(set(greedy.tolist())) > 1, "weak test: one action for all inputs"
    batch = ts.restart(observation, batch_size=32)
    np.testing.assert_array_equal(policy.action(batch).action, greedy)
    np.testing.assert_array_equal(client(observation)["action"], greedy)
    single = policy.action(ts.restart(observation[5]))
    assert single.action.shape == () and single.action == greedy[5]
    sampled = ExportedPyPolicy(path, sampled=True).action(batch).action
    assert sampled.dtype == np.int32 and ((0 <= sampled) & (sampled < 3)).all()


def test_tf_agents_driver_and_metrics_play_the_exported_policy_on_the_pool(catch_policy):
    network, path, _ = catch_policy
    with PoolPyEnvironment(SerialPool(CatchConfig(), 4, seed=2)) as env:
        policy = ExportedPyPolicy(path)
        assert policy.time_step_spec.observation.shape == env.observation_spec().shape
        average_return = py_metrics.AverageReturnMetric(batch_size=4, buffer_size=1000)
        trajectories = []
        driver = py_driver.PyDriver(
            env, policy, observers=[average_return, trajectories.append], max_steps=4 * 30
        )
        driver.run(env.reset())
    observations = np.stack([t.observation for t in trajectories])  # [T, B, ...]
    actions = np.stack([t.action for t in trajectories])  # [T, B]
    flat = observations.reshape(-1, *observations.shape[2:])
    expected = network(flat)[0].numpy().argmax(-1).reshape(actions.shape)
    np.testing.assert_array_equal(actions, expected)  # the driver asked the exported policy
    episodes = np.stack([t.is_last() for t in trajectories]).sum()
    assert episodes >= 8 and -1.0 <= average_return.result() <= 1.0


def test_sampling_a_q_policy_is_refused_by_name(tmp_path):
    network = QNetwork(CatchConfig()(0).spec, torso=a3c_torso)
    export.export_policy(network, None, str(tmp_path / "policy"), head="q_values")
    with pytest.raises(ValueError, match="sampled actions need a policy-gradient policy"):
        ExportedPyPolicy(str(tmp_path / "policy"), sampled=True)
