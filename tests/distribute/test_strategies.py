"""tfaccel.distribute: strategies, batch sharding, and the equivalence of a mirrored update with
one device's update on the whole batch (the target of synchronous training)."""

import json
import os
import signal
import subprocess
import sys
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import launcher
from tfaccel.distribute import asynchronous, strategies
from tfaccel.distribute.param_store import ParameterStore
from tfaccel.types import Rollout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_fresh(code: str) -> str:
    """Runs `code` in a new interpreter (logical devices must be set before TensorFlow starts)."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_shard_splits_rollouts_by_env_and_refuses_uneven_splits():
    rollout = Rollout(*[np.arange(2 * 4).reshape(2, 4)] * 8, bootstrap_observation=np.arange(4))
    first = strategies.shard(rollout, 0, 2, Rollout.env_axes())
    second = strategies.shard(rollout, 1, 2, Rollout.env_axes())
    np.testing.assert_array_equal(first.action, [[0, 1], [4, 5]])
    np.testing.assert_array_equal(second.action, [[2, 3], [6, 7]])
    np.testing.assert_array_equal(second.bootstrap_observation, [2, 3])
    with pytest.raises(ValueError, match="batch axis of 4 does not split among 3 replicas"):
        strategies.shard(rollout, 0, 3, Rollout.env_axes())


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "needs TF_CONFIG"),
        ("{not json", "TF_CONFIG is not JSON"),
        ('{"task": {"type": "worker", "index": 0}}', "no cluster.worker list"),
        ('{"cluster": ["a:1"], "task": {"type": "worker", "index": 0}}', "no cluster.worker list"),
        ('["a:1"]', "no cluster.worker list"),
        ('{"cluster": {"worker": ["a:1"]}, "task": "worker"}', "no task type 'worker'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps"}}', "no task type 'worker'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "not in 0..0"),
        (
            '{"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, '
            '"task": {"type": "worker", "index": 0}}',
            "names a 'chief' task",
        ),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "'chief'"),
        # no port: TensorFlow's 57-line "Could not parse port for local server"
        (
            '{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}}',
            "entry 'localhost' is not host:port",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:70000"]}, "task": {"type": "worker", "index": 0}}',
            "entry 'b:70000' is not host:port",
        ),
    ],
)
def test_malformed_tf_config_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        strategies.check_tf_config(text)


def test_check_tf_config_accepts_a_two_worker_cluster():
    text = json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    )
    assert strategies.check_tf_config(text)["task"]["index"] == 1


def test_the_default_strategy_needs_no_devices_line():
    assert strategies.describe(tf.distribute.get_strategy()) == ""


def test_unknown_strategy_kind_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid kinds: default, mirrored, multi_worker"):
        strategies.make_strategy("parameter_server")


EQUIVALENCE = """
from tfaccel.distribute import asynchronous, strategies
mirrored = strategies.make_strategy("mirrored", logical_cpus=2)
print("devices", strategies.describe(mirrored))
import keras, numpy as np, tensorflow as tf
from tests.algorithms.test_a2c import TinyNetwork, random_rollout
from tests.algorithms.test_dqn import TinyQNetwork, random_batch
from tfaccel import learner
from tfaccel.algorithms import a2c, dqn, ppo
from tfaccel.types import Rollout

def worst(one, two):
    rel = [np.max(np.abs(a.numpy() - b.numpy())) / (np.max(np.abs(a.numpy())) + 1e-12)
           for a, b in zip(one.network.variables, two.network.variables)]
    return max(rel)

def replicas_agree(agent):
    return all(np.array_equal(v.value.values[0].numpy(), v.value.values[1].numpy())
               for v in agent.network.variables)

# A2C: three updates on rollouts of 4 envs; clipping (max_grad_norm 0.05) is active.
config = a2c.A2CConfig(max_grad_norm=0.05)
agents = [learner.Learner(lambda: TinyNetwork(3, observation_shape=(4, 4, 2), seed=0),
                          lambda n, b: a2c.loss(n, b, config), lambda: learner.make_adam(1e-2),
                          max_grad_norm=config.max_grad_norm, strategy=strategy,
                          batch_axes=Rollout.env_axes())
          for strategy in (tf.distribute.get_strategy(), mirrored)]
for seed in range(3):
    single, split = (agent.train(random_rollout(seed=seed, envs=4)) for agent in agents)
    assert abs(single["grad_norm"] - split["grad_norm"]) <= 1e-5 * single["grad_norm"]
    assert single["grad_norm"] > config.max_grad_norm  # the clip acted
print("a2c", mirrored.num_replicas_in_sync, worst(*agents), replicas_agree(agents[1]))
print("rate", agents[1].learning_rate)  # a constant rate: a mirrored variable

# PPO: 3 epochs of whole-share steps in one graph loop (a whole share's step does not depend on
# the share's order; advantages not normalized, which a replica would do on its share alone).
p_config = ppo.PPOConfig(epochs=3, minibatches=1, normalize_advantage=False)
p_agents = [learner.Learner(lambda: TinyNetwork(3, observation_shape=(4, 4, 2), seed=0),
                            lambda n, b: ppo.loss(n, b, p_config), lambda: learner.make_adam(1e-2),
                            prepare_fn=lambda n, b: ppo.samples(n, b, p_config), epochs=3,
                            strategy=strategy, batch_axes=Rollout.env_axes())
            for strategy in (tf.distribute.get_strategy(), mirrored)]
for seed in range(2):
    single, split = (agent.train(random_rollout(seed=seed, steps=4, envs=4)) for agent in p_agents)
steps = keras.ops.convert_to_numpy(p_agents[1].optimizer.iterations)
print("ppo", worst(*p_agents), replicas_agree(p_agents[1]), steps)

# A NaN reward in the second replica's share only: every replica skips the step, and says why.
bad = random_rollout(seed=9, envs=4)
reward = np.array(bad.reward, np.float32)
reward[:, 3] = np.nan
before = [v.value.values[0].numpy().copy() for v in agents[1].network.variables]
metrics = agents[1].train(bad._replace(reward=reward))
unchanged = all(np.array_equal(b, v.value.values[0].numpy())
                for b, v in zip(before, agents[1].network.variables))
print("nan", metrics["skipped_updates"], agents[1].last_fault == "the loss", unchanged,
      replicas_agree(agents[1]))

# DQN: per-sample priorities come back in the batch's order.
q_config = dqn.DQNConfig()
q_agents = []
for strategy in (tf.distribute.get_strategy(), mirrored):
    def make():
        net = TinyQNetwork(3, observation_shape=(6, 6, 2))
        net.head.kernel.assign(np.random.default_rng(0).normal(0, 0.1, net.head.kernel.shape))
        return net
    agent = learner.Learner(make, lambda n, b: dqn.loss(n, b, q_config, target=agent_target(n)),
                            lambda: learner.make_adam(1e-2), strategy=strategy,
                            target_network=True)
    q_agents.append(agent)
targets = {id(a.network): a.target for a in q_agents}
def agent_target(network):
    return targets[id(network)]
batch = random_batch(seed=3, n=8)
one, two = (agent.train(batch) for agent in q_agents)
np.testing.assert_allclose(one["priority"], two["priority"], rtol=1e-5)
print("dqn", worst(*q_agents), replicas_agree(q_agents[1]))
"""


def test_mirrored_update_equals_one_device_on_the_whole_batch_and_skips_together():
    lines = dict(line.split(" ", 1) for line in run_fresh(EQUIVALENCE).splitlines() if " " in line)
    assert lines["devices"] == (
        "devices: CPU:0, CPU:1 (2 replicas: each computes 1/2 of every batch, and their "
        "gradients are averaged)"
    )
    replicas, a2c_difference, a2c_agree = lines["a2c"].split()
    assert replicas == "2" and a2c_agree == "True"
    assert float(a2c_difference) <= 1e-5
    assert lines["nan"] == "1.0 True True True"
    assert float(lines["rate"]) == pytest.approx(1e-2)
    dqn_difference, dqn_agree = lines["dqn"].split()
    assert float(dqn_difference) <= 1e-5 and dqn_agree == "True"
    ppo_difference, ppo_agree, ppo_steps = lines["ppo"].split()
    assert float(ppo_difference) <= 1e-5 and ppo_agree == "True" and ppo_steps == "6"


def test_slurm_cluster_outside_a_slurm_job_is_named(monkeypatch):
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with pytest.raises(ValueError, match="needs a Slurm job step .* start the workers with srun"):
        strategies.make_strategy("multi_worker", cluster="slurm")
    with pytest.raises(ValueError, match="valid: tf_config, slurm"):
        strategies.make_strategy("multi_worker", cluster="k8s")


@pytest.mark.parametrize("visible", [None, "-1", "0,1"])
def test_a_slurm_step_on_cpu_nodes_or_gpu_nodes_gives_every_task_its_place(
    tmp_path, monkeypatch, visible
):
    """On CPU nodes (no nvidia-smi) the resolver failed: "No such file or directory:
    'nvidia-smi'", or "range() arg 3 must not be zero" where nvidia-smi listed no GPU."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    for name, value in [("SLURM_PROCID", "1"), ("SLURM_STEP_NODELIST", "node[1-2]"),
                        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"), ("SLURM_STEP_NUM_TASKS", "4")]:  # fmt: skip
        monkeypatch.setenv(name, value)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:  # -1: GPUs hidden
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus = visible == "0,1"
    resolver = strategies._cluster_resolver("slurm", 8888)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:8888", "node1:8889", "node2:8888", "node2:8889"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    # CPU nodes: no GPU named or reported; GPU nodes: the second task of node1 takes its second
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ("1" if gpus else visible)
    assert resolver.num_accelerators() == ({"GPU": 1} if gpus else {})
    # An asynchronous run's launcher computes on the CPU and leaves the task's share of the GPUs
    # to its learners: named for them, none reported to its strategy.
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    launcher_side = strategies._cluster_resolver("slurm", 8888, cpu_only=True)
    assert launcher_side.cluster_spec().as_dict() == resolver.cluster_spec().as_dict()
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ("1" if gpus else visible)
    assert launcher_side.num_accelerators() == {}


@pytest.mark.parametrize("cpu_only", [False, True])
def test_a_slurm_task_keeps_the_gpus_slurm_bound_to_it_and_too_few_gpus_are_named(
    tmp_path, monkeypatch, cpu_only
):
    """With srun --gpus-per-task, each task sees its own GPUs only: the resolver split them
    again among the node's tasks (0 each: "range() arg 3 must not be zero")."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    for name, value in [("SLURM_PROCID", "1"), ("SLURM_STEP_NODELIST", "node[1-2]"),
                        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"), ("SLURM_STEP_NUM_TASKS", "4"),
                        ("SLURM_GPUS_PER_TASK", "1"), ("CUDA_VISIBLE_DEVICES", "3")]:  # fmt: skip
        monkeypatch.setenv(name, value)
    resolver = strategies._cluster_resolver("slurm", 8888, cpu_only)
    assert resolver.cluster_spec().as_dict()["worker"][1] == "node1:8889"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"  # its own, as Slurm named it
    assert resolver.num_accelerators() == ({} if cpu_only else {"GPU": 1})
    # Every task sees the node's one GPU, two tasks: no share for each.
    monkeypatch.delenv("SLURM_GPUS_PER_TASK")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match="this Slurm node has 1 GPUs for 2 tasks: give every task"):
        strategies._cluster_resolver("slurm", 8888, cpu_only)


def test_the_collective_timeout_is_the_one_make_strategy_took():
    """A binding through a gin macro is resolved (the launcher and learners read it)."""
    gin.parse_config("TIMEOUT = 7\nmake_strategy.timeout_seconds = %TIMEOUT")
    strategies.make_strategy()
    assert strategies.collective_timeout() == 7.0


def test_sigterm_after_the_multi_worker_strategy_is_made_still_ends_the_process():
    # TensorFlow's coordination service sets a SIGTERM handler that only logs; make_strategy puts
    # Python's back, so a job scheduler's SIGTERM during start-up is not lost (before the fix the
    # process printed "alive" and exited 0).
    code = """if True:
        import json, os, signal, socket, time
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cluster = {"worker": [f"127.0.0.1:{port}"]}
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
        from tfaccel.distribute import strategies
        strategies.make_strategy("multi_worker")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("alive")
    """
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == -signal.SIGTERM and "alive" not in out.stdout, out.stderr[-3000:]


def test_learners_take_the_gpus_the_user_made_visible_in_turn():
    assert launcher.learner_gpus(2, 0, None) == [{}, {}]
    mine = launcher.learner_gpus(2, 2, "2,3")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in mine] == ["2", "3"]
    assert all("TF_FORCE_GPU_ALLOW_GROWTH" not in env for env in mine)  # one GPU each
    shared = launcher.learner_gpus(3, 2, None)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in shared] == ["0", "1", "0"]
    assert all(env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for env in shared)


class _AddLearner:
    """A learner whose update adds the batch to its one variable."""

    def __init__(self):
        self.variable = tf.Variable(np.zeros(3, np.float32))
        self.network = types.SimpleNamespace(trainable_variables=[self.variable])

    def train(self, batch):
        self.variable.assign_add(np.full(3, batch, np.float32))
        return {}


def test_an_async_learner_saves_the_stores_parameters_and_a_restore_resets_the_store():
    store = ParameterStore.create(3)
    try:
        store.set(np.ones(3, np.float32))
        agent = _AddLearner()
        sync = asynchronous.StoreSync(agent, steps_per_push=4)
        sync.connect(store)
        np.testing.assert_array_equal(agent.variable.numpy(), [1, 1, 1])
        sync.train(1.0)  # a round in progress: the store has not seen it
        store.push(np.full(3, 10, np.float32))  # another learner's push
        np.testing.assert_array_equal(store.pull(), [11, 11, 11])
        sync.flush()  # before a save: both changes, in the store and in the network
        np.testing.assert_array_equal(store.pull(), [12, 12, 12])
        np.testing.assert_array_equal(agent.variable.numpy(), [12, 12, 12])
        agent.variable.assign(np.full(3, 5, np.float32))  # the checkpoint's weights, restored
        sync.reset_store()
        np.testing.assert_array_equal(store.pull(), [5, 5, 5])
        sync.train(1.0)  # a new round starts from the store
        np.testing.assert_array_equal(agent.variable.numpy(), [6, 6, 6])
    finally:
        store.close()
