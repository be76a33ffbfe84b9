"""bin/train end to end: artifacts, resume, every config at smoke scale, seeds, and learning
on toy envs."""

import csv
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.integration.commands import ROOT, SMOKE, TIMING, rows, train
from tfaccel import networks


@pytest.mark.fast
def test_smoke_run_writes_every_artifact(tmp_path):
    result = train(
        tmp_path, *SMOKE, "--gin_bindings=RunConfig.eval_episodes = 1",
        "--gin_bindings=AtariConfig.max_agent_steps = 300",  # the evaluation game is cut
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2,000 frames (500 agent steps)" in result.stdout
    summary = result.stdout.strip().splitlines()[-6:]  # the score, then where things are
    assert summary[0].startswith("score") and summary[1] == f"run directory {tmp_path}:"
    assert f"bin/plot --run_dir={tmp_path}" in summary[4]  # a command of this checkout
    assert f"bin/eval --policy_dir={tmp_path}/policy" in summary[3]
    table = rows(tmp_path)
    assert 100 < float(table[-1]["peak_rss_mib"]) < 8_000  # the trainer's, in MiB
    for column in (
        "env_frames",
        "agent_steps",
        "wall_s",
        "fps",
        "episode_return_raw_mean",
        "episodes",
    ):
        assert column in table[0]
    frames = [int(row["env_frames"]) for row in table]
    assert frames == sorted(frames) and frames[-1] == 2000
    assert all(int(row["env_frames"]) == 4 * int(row["agent_steps"]) for row in table)
    # The speed it prints is metrics.csv's: it divided by a time that also counted the final
    # checkpoint, export and evaluation game (128 agent steps/s where the log gave 173).
    (done,) = [line for line in result.stdout.splitlines() if line.startswith("done: ")]
    printed = int(done.rsplit(", ", 1)[1].split()[0].replace(",", ""))
    assert printed == round(500 / float(table[-1]["wall_s"])), (done, table[-1]["wall_s"])
    config = (tmp_path / "operative_config.gin").read_text()
    assert "RunConfig.total_frames = 2000" in config and "AtariConfig.game = 'pong'" in config
    assert (tmp_path / "checkpoints" / "checkpoint").exists()
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "tb"))
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["preprocessing"]["game"] == "pong" and metadata["extra"]["env_frames"] == 2000
    evaluations = list(csv.DictReader(open(tmp_path / "eval.csv", newline="")))
    assert [int(row["env_frames"]) for row in evaluations][-1] == 2000
    assert float(evaluations[-1]["eval_return_mean"]) <= -2  # an untrained Pong policy loses
    assert evaluations[-1]["eval_at_step_limit"] == "1"  # it was logged as if it had ended


def test_same_command_resumes_counters_and_csv(tmp_path):
    first = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.total_frames = 1000")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(tmp_path, *SMOKE)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    (kept,) = tmp_path.glob("operative_config.*.gin")  # the first run's settings, kept
    assert (
        f"warning: resumed with 1 setting(s) changed since the run last ran (its settings then: "
        f"{kept}): RunConfig.total_frames: 1000 -> 2000"
    ) in second.stdout
    assert "RunConfig.total_frames = 1000" in kept.read_text()
    assert "RunConfig.total_frames = 2000" in (tmp_path / "operative_config.gin").read_text()
    table = rows(tmp_path)
    frames = [int(row["env_frames"]) for row in table]
    assert frames == sorted(frames) and frames[0] < 1200 < 2000 <= frames[-1] < 2100
    wall = [float(row["wall_s"]) for row in table]
    assert wall == sorted(wall)  # wall time continues too
    assert open(tmp_path / "metrics.csv").read().count("env_frames") == 1  # one header
    again = train(tmp_path, *SMOKE)  # nothing left to do: says so and trains no further
    assert again.returncode == 0 and "the run is complete" in again.stdout
    assert "setting(s) changed" not in again.stdout  # the same settings: nothing to say
    assert len(rows(tmp_path)) == len(table)


@pytest.mark.parametrize(
    "args",
    [
        ["--gin_file=catch_a2c.gin"],
        ["--gin_file=catch_ppo.gin"],
        ["--gin_file=catch_dqn.gin"],
        ["--gin_file=catch_dqn.gin", "--gin_bindings=DQNConfig.num_atoms = 51"],
        ["--gin_file=catch_a3c.gin"],
        ["--gin_file=catch_appo.gin"],
        ["--gin_file=catch_vector_ppo.gin"],
        ["--gin_file=catch_a2c.gin", "--gin_bindings=set_precision.policy = 'mixed_bfloat16'"],
        ["--gin_file=catch_dqn.gin", "--gin_bindings=set_precision.policy = 'mixed_bfloat16'"],
    ],
    ids=[
        "a2c",
        "ppo",
        "dqn",
        "categorical_dqn",
        "a3c",
        "appo",
        "ppo_vector",
        "a2c_bf16",
        "dqn_bf16",
    ],
)
def test_learns_catch_in_seconds(tmp_path, args):
    result = train(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(row["episode_return_raw_mean"]) for row in rows(tmp_path)]
    assert min(scores[:3]) < 0.2  # a random paddle misses most balls (mean about -0.6)
    assert max(scores[-3:]) >= 0.6, scores
    if any("mixed_bfloat16" in arg for arg in args):  # said where this machine emulates it
        slow = networks.precision_warning("mixed_bfloat16") is not None
        assert ("warning: mixed_bfloat16" in result.stdout) == slow, result.stdout[-2000:]


@pytest.mark.parametrize(
    "trainer, args",
    [
        ("train", ["--gin_file=catch_a2c.gin", "--gin_bindings=RunConfig.total_frames = 6_000",
                   "--gin_bindings=RunConfig.log_interval_frames = 2_000"]),
        ("train_off_policy", ["--gin_file=catch_dqn.gin", "--gin_bindings=train_off_policy.prefetch = False",
                              "--gin_bindings=RunConfig.total_frames = 3_000"]),
    ],
    ids=["a2c", "dqn"],
)  # fmt: skip
def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path, trainer, args):
    """Initial weights, envs, actions and batches all follow the seed (one worker: a fixed order)."""
    runs = {}
    for name, seed in [("first", 3), ("again", 3), ("other", 4)]:
        result = train(tmp_path / name, *args, f"--gin_bindings=RunConfig.seed = {seed}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = [
            {column: value for column, value in row.items() if column not in TIMING}
            for row in rows(tmp_path / name)
        ]
    assert len(runs["first"]) >= 2 and "grad_norm" in runs["first"][0]
    assert runs["again"] == runs["first"]
    assert runs["other"] != runs["first"]


@pytest.mark.parametrize(
    "config, columns",
    [
        pytest.param("ppo.gin", {"approx_kl", "clip_fraction"}, marks=pytest.mark.fast),
        ("reference/a2c_stooke2018_256envs.gin", {"policy_loss", "entropy"}),
        ("reference/a2c_baselines.gin", {"policy_loss", "entropy"}),
        ("a2c_bf16.gin", {"policy_loss", "entropy"}),
    ],
)
def test_every_config_runs_with_smoke(tmp_path, config, columns):
    bindings = ["--gin_bindings=train.horizon = 16"] if config == "ppo.gin" else []
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin", *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert int(table[-1]["env_frames"]) >= 2000
    assert columns <= set(table[-1])
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    if config == "reference/a2c_baselines.gin":  # Baselines' frames: the whole screen, 84x84
        described = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
        assert described["observation"]["shape"] == [84, 84, 4]
        assert described["preprocessing"]["crop_top"] == 0
    if config == "a2c_bf16.gin":  # its rate is constant, and its torso computes in bfloat16
        assert [float(row["learning_rate"]) for row in table] == pytest.approx([7e-4] * len(table))
        assert (
            "set_precision.policy = 'mixed_bfloat16'"
            in (tmp_path / "operative_config.gin").read_text()
        )
        return
    # The learning rate falls linearly with the frames done, however many SGD steps an update
    # takes (PPO: epochs x minibatches); one rollout of frames may still be ahead of the row.
    initial = {
        "ppo.gin": 2.5e-4,
        "reference/a2c_stooke2018_256envs.gin": 1.4e-3,
        "reference/a2c_baselines.gin": 7e-4,
    }[config]
    for row in table:
        remaining = 1 - int(row["env_frames"]) / 2000
        assert float(row["learning_rate"]) == pytest.approx(initial * remaining, abs=0.25 * initial)
    assert float(table[0]["learning_rate"]) > 0.5 * initial


@pytest.mark.parametrize("config", ["a2c.gin", "ppo.gin", "categorical_dqn.gin"])
def test_mirrored_strategy_trains_every_family(tmp_path, config):
    horizon = ["--gin_bindings=train.horizon = 16"] if config == "ppo.gin" else []
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin",
                   "--gin_file=distribute/mirrored.gin", *horizon)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "make_strategy.kind = 'mirrored'" in (tmp_path / "operative_config.gin").read_text()
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 2000
    assert (tmp_path / "policy" / "saved_model.pb").exists()


def test_warmup_frames_raise_the_rate_linearly_then_hold_it(tmp_path):
    result = train(
        tmp_path, *SMOKE, "--gin_bindings=train.decay_learning_rate = False",
        "--gin_bindings=train.warmup_frames = 1200",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    # One update per rollout of a group: 2 envs x 5 steps x frame skip 4 = 40 frames; the
    # warm-up is 1,200 / 40 = 30 updates, and a row shows the rate of the update after it.
    first = int(table[0]["env_frames"])
    expected = 7e-4 * (first // 40) / 30  # the rate of the last step taken
    assert float(table[0]["learning_rate"]) == pytest.approx(expected, rel=1e-5)  # 6 digits
    assert float(table[-1]["learning_rate"]) == pytest.approx(7e-4)
    rates = [float(row["learning_rate"]) for row in table]
    assert rates == sorted(rates) and rates[0] < 7e-4 / 2


@pytest.mark.parametrize(
    "config, head",
    [
        ("dqn.gin", "q_values"),
        pytest.param("categorical_dqn.gin", "probabilities", marks=pytest.mark.fast),
        ("rainbow.gin", "probabilities"),
        ("reference/dqn_nature2015.gin", "q_values"),
        ("reference/c51_dopamine.gin", "probabilities"),
        ("reference/c51_stooke2018_b2048.gin", "probabilities"),
        ("reference/rainbow_hessel2018.gin", "probabilities"),
    ],
)
def test_every_q_config_runs_with_smoke(tmp_path, config, head):
    evaluation = (  # a checkpoint at every 400 frames, the last at the end: saved once
        [
            "--gin_bindings=RunConfig.eval_episodes = 1",
            "--gin_bindings=RunConfig.checkpoint_interval_frames = 400",
        ]
        if config == "dqn.gin"
        else []
    )
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin", *evaluation)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert int(table[-1]["env_frames"]) == 2000
    assert table[-1]["loss"] and float(table[-1]["epsilon"]) < 1.0  # it trained from replay
    # beta weighs the samples of prioritized replay alone: logged without it, it misled
    prioritized = "prioritized = True" in (tmp_path / "operative_config.gin").read_text()
    assert ("priority_beta" in table[-1]) == prioritized == ("rainbow" in config)
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["head"] == head and metadata["num_actions"] == 6
    if evaluation:  # the exported Q policy played a full game at each checkpoint
        scores = list(csv.DictReader(open(tmp_path / "eval.csv", newline="")))
        assert [int(row["env_frames"]) for row in scores] == [400, 800, 1200, 1600, 2000]
        assert float(scores[-1]["eval_return_mean"]) <= -15  # an untrained Pong policy loses


def test_off_policy_run_trains_from_replay_exports_and_resumes(tmp_path):
    bindings = ["--gin_bindings=RunConfig.total_frames = 3000",
                "--gin_bindings=RunConfig.checkpoint_interval_frames = 1500"]  # fmt: skip
    result = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(tmp_path)
    assert {"loss", "q_mean", "replay_size", "epsilon"} <= set(table[-1])
    assert float(table[-1]["epsilon"]) < 1.0 and int(table[-1]["replay_size"]) > 1000
    metadata = json.loads((tmp_path / "policy" / "tfaccel_policy.json").read_text())
    assert metadata["head"] == "q_values" and metadata["num_actions"] == 3
    resumed = train(tmp_path, "--gin_file=catch_dqn.gin", bindings[0].replace("3000", "4000"))
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-3000:]
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 4000


def test_replay_is_checkpointed_on_request_and_restored(tmp_path):
    bindings = ["--gin_bindings=train_off_policy.checkpoint_replay = True",
                "--gin_bindings=RunConfig.total_frames = 3000",
                "--gin_bindings=RunConfig.checkpoint_interval_frames = 1500",
                "--gin_bindings=RunConfig.log_interval_frames = 200"]  # fmt: skip
    first = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "filling the replay: learning starts when" in first.stdout
    saved = sorted(os.listdir(tmp_path / "checkpoints"))
    assert [name for name in saved if name.startswith("replay-")] == ["replay-3000.npz"]
    stored = int(rows(tmp_path)[-1]["replay_size"])
    assert stored > 2500  # 3000 steps less the windows still open

    resumed = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings[:2],
                    "--gin_bindings=RunConfig.total_frames = 3400")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "replay restored" in resumed.stdout
    assert "filling the replay" not in resumed.stdout  # it said so, then learnt at once
    after = [row for row in rows(tmp_path) if int(row["env_frames"]) > 3000]
    # The restored memory is there at once: no refill from zero, and learning goes on.
    assert int(after[0]["replay_size"]) >= stored and float(after[0]["learn_fraction"]) > 0
    assert sorted(os.listdir(tmp_path / "checkpoints")).count("replay-3400.npz") == 1
    assert "replay-3000.npz" not in os.listdir(tmp_path / "checkpoints")

    (tmp_path / "checkpoints" / "replay-3400.npz").write_bytes(b"not a zip file")
    broken = train(tmp_path, "--gin_file=catch_dqn.gin", *bindings[:2],
                   "--gin_bindings=RunConfig.total_frames = 3800")  # fmt: skip
    assert broken.returncode != 0
    assert "cannot restore the replay memory from" in broken.stderr.strip().splitlines()[-1]


IN_PROCESS_ENV = """
import dataclasses, sys
import keras
from tfaccel import on_policy, runner
from tfaccel.algorithms import a2c
from tfaccel.envs.toy import CatchConfig


@dataclasses.dataclass(frozen=True)
class NotebookCatch(CatchConfig):  # defined in __main__: worker processes could not import it
    pass


class TwoHeads(keras.Model):  # a whole network of one's own, built lazily, without a `spec`
    def __init__(self, num_actions):
        super().__init__()
        self.body = [keras.layers.Conv2D(8, 4, strides=2, activation="relu"),
                     keras.layers.Flatten(), keras.layers.Dense(32, activation="relu")]
        self.logits, self.value = keras.layers.Dense(num_actions), keras.layers.Dense(1)

    def call(self, observation):
        x = keras.ops.cast(observation, "float32") / 255.0
        for layer in self.body:
            x = layer(x)
        return self.logits(x), keras.ops.squeeze(self.value(x), -1)


def small_network(spec):  # train.network: it ended with "Unknown variable" (not built), then
    return TwoHeads(spec.num_actions)  # "cannot tell the observation shape" at the export


import gin  # in bfloat16 its Dense heads returned bfloat16, which the loss refused
gin.bind_parameter("set_precision.policy", "mixed_bfloat16")
summary = on_policy.train(
    sys.argv[1], env=NotebookCatch(), loss_fn=a2c.loss, act_fn=a2c.act,
    algorithm=a2c.A2CConfig(), pool_config=runner.PoolConfig(num_workers=0, envs_per_worker=4),
    run_config=runner.RunConfig(
        total_frames=800, log_interval_frames=400, checkpoint_interval_frames=800
    ),
    network=small_network,
)
print("frames", summary["env_frames"])
"""


def test_zero_workers_step_an_env_defined_in_main_with_a_network_of_ones_own(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", IN_PROCESS_ENV, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split("frames")[-1]) >= 800
    assert int(rows(tmp_path)[-1]["env_frames"]) >= 800
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    shapes = [shape for _, shape in tf.train.list_variables(str(tmp_path / "checkpoints"))]
    assert [4, 4, 1, 8] in shapes  # the network of one's own was trained and saved


def test_ppo_learns_gymnasium_cartpole(tmp_path):
    result = train(tmp_path, "--gin_file=cartpole_ppo.gin")
    assert result.returncode == 0, result.stderr[-3000:]
    scores = [float(row["episode_return_raw_mean"]) for row in rows(tmp_path)]
    # A random policy balances for about 22 steps; the first row averages the episodes of the
    # first ~5 updates (25 to 45 seen). The last rows reach 100 to 160 (README), well above both.
    assert scores[0] < 60, scores
    assert max(scores[-3:]) >= max(80, 1.5 * scores[0]), scores


@pytest.mark.parametrize("config, torso", [("a2c.gin", "a3c_torso"), ("dqn.gin", "nature_torso")])
def test_the_background_is_measured_once_and_resumed_and_exported(tmp_path, config, torso):
    import tensorflow as tf

    bindings = [f"--gin_file={config}", "--gin_file=smoke.gin",
                f"--gin_bindings={torso}.subtract_background = True"]  # fmt: skip
    first = train(tmp_path, *bindings)
    assert first.returncode == 0, first.stderr[-3000:]
    (line,) = [line for line in first.stdout.splitlines() if "background pixel" in line]
    measured = float(line.rsplit(" ", 1)[1])
    assert measured == pytest.approx(87 / 255, abs=1e-4)  # Pong's
    more = train(tmp_path, *bindings, "--gin_bindings=RunConfig.total_frames = 2800")
    assert more.returncode == 0 and "background pixel" not in more.stdout, more.stderr[-3000:]
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    offsets = [name for name in reader.get_variable_to_shape_map() if "offset" in name]
    assert offsets and all(
        reader.get_tensor(n) == pytest.approx(measured, abs=1e-4) for n in offsets
    )
    assert len(offsets) == (2 if config == "dqn.gin" else 1)  # the target network's too
    served = tf.saved_model.load(str(tmp_path / "policy")).signatures["serving_default"]
    assert served(observation=tf.zeros([1, 104, 80, 4], tf.uint8))  # the export runs with it


def test_a_ppo_smoke_run_updates_at_a_rate_above_zero(tmp_path):
    """smoke.gin's 2,000 frames are less than one PPO rollout (8 envs x 128 steps x 4 frames):
    the decay spanned 0 rollouts, and the run's only update took its steps at rate 0."""
    result = train(tmp_path, "--gin_file=ppo.gin", "--gin_file=smoke.gin")
    assert result.returncode == 0, result.stderr[-3000:]
    rates = [float(row["learning_rate"]) for row in rows(tmp_path) if row.get("learning_rate")]
    # Rollouts of 2 envs x 128 steps x 4 frames = 1,024 frames: the decay spans the 2 rollouts
    # the run could take (32 SGD steps); it took one, its last step (15) at 2.5e-4 x 17 / 32.
    assert rates and rates[-1] == pytest.approx(2.5e-4 * 17 / 32, rel=1e-3)
