"""The Python API: `tfaccel.train` any number of times in one process, the `Run` it returns,
and `tfaccel.load_policy`."""

import os
import re
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest

import tfaccel
from tests.fakes import as_from_a_terminal
from tfaccel import evaluate
from tfaccel.algorithms import a2c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_importing_tfaccel_imports_no_tensorflow():
    code = "import sys, tfaccel; tfaccel.__version__; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_two_algorithms_in_one_process_and_what_a_run_gives(tmp_path, capsys):
    """A second run in the same process ended with "Attempted to modify locked Gin config"."""
    a2c = tfaccel.train(["a2c.gin", "smoke.gin"], str(tmp_path / "a2c"))
    c51 = tfaccel.train(
        "categorical_dqn.gin",
        str(tmp_path / "c51"),
        ["PoolConfig.num_workers = 1", "PoolConfig.envs_per_worker = 4"],
        total_frames=1_200,
        replay_capacity=4_000,
        min_replay_steps=100,
        log_interval_frames=400,
    )
    assert a2c.summary["env_frames"] >= 2_000 and c51.summary["env_frames"] >= 1_200
    assert [row["env_frames"] for row in c51.metrics][-1] >= 1_200
    assert "policy_loss" in a2c.metrics[-1] and "epsilon" in c51.metrics[-1]
    assert "DQNConfig.num_atoms = 51" in (tmp_path / "c51" / "operative_config.gin").read_text()
    assert "DQNConfig" not in (tmp_path / "a2c" / "operative_config.gin").read_text()
    outputs = c51.policy(np.zeros([2, 104, 80, 4], np.uint8))
    assert outputs["action"].shape == (2,) and outputs["probabilities"].shape == (2, 6, 51)
    loaded = tfaccel.load_policy(str(tmp_path / "a2c" / "policy"))
    assert loaded(np.zeros([1, 104, 80, 4], np.uint8))["logits"].shape == (1, 6)
    scores = a2c.evaluate(episodes=1, max_agent_steps=30)
    assert scores["lengths"] == [30] and scores["epsilon"] == 0.001
    # 2,000 frames of Pong end no game: the README's run.plot still draws (empty axes, a note).
    assert a2c.plot(str(tmp_path / "curves.png")) == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # By default into the run's own directory: two runs' plots wrote one ./curves.png. Its
    # warning goes to stderr, as tfaccel-plot's, not between a notebook's results.
    capsys.readouterr()
    assert a2c.plot() == str(tmp_path / "a2c" / "curves.png")
    assert (tmp_path / "a2c" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr()
    assert "warning: no finished game yet" in printed.err and "warning" not in printed.out
    again = tfaccel.train(["a2c.gin", "smoke.gin"], str(tmp_path / "a2c"))  # already done
    assert again.summary["env_frames"] == a2c.summary["env_frames"]


@gin.configurable
def scaled_a2c_loss(network, rollout, config, scale=1.0):
    """The A2C loss times `scale`: a configurable loss with a setting of its own."""
    loss, metrics = a2c.loss(network, rollout, config)
    return loss * scale, metrics


def test_a_configurable_losss_own_settings_are_recorded_and_compared_on_resume(tmp_path, capfd):
    """They are called only inside the first update, after operative_config.gin was written: the
    file lacked them, and a resume with another value went on without a word."""
    loss = ["train.loss_fn = @scaled_a2c_loss", "scaled_a2c_loss.scale = 0.5"]
    tfaccel.train(["catch_a2c.gin", "smoke.gin"], str(tmp_path), loss)
    recorded = (tmp_path / "operative_config.gin").read_text()
    assert "scaled_a2c_loss.scale = 0.5" in recorded
    assert "train_off_policy" not in recorded  # smoke.gin's other family: not this run's
    capfd.readouterr()
    loss[1] = "scaled_a2c_loss.scale = 0.25"
    tfaccel.train(["catch_a2c.gin", "smoke.gin"], str(tmp_path), loss, total_frames=4_000)
    assert "scaled_a2c_loss.scale: 0.5 -> 0.25" in capfd.readouterr().out


@pytest.mark.parametrize(
    "config, overrides, bindings",
    [
        ("a2c.gin", dict(game="breakout", seed=2, learning_rate=1e-3),
         ["AtariConfig.game = 'breakout'", "RunConfig.seed = 2", "train.learning_rate = 0.001"]),
        ("dqn.gin", dict(sticky_action_prob=0.25, batch_size=64),
         ["AtariConfig.sticky_action_prob = 0.25", "train_off_policy.batch_size = 64"]),
        ("catch_a2c.gin", dict(envs_per_worker=2), ["PoolConfig.envs_per_worker = 2"]),
    ],
)  # fmt: skip
def test_overrides_reach_the_run_the_pool_the_trainer_or_the_env(config, overrides, bindings):
    """`game="breakout"`, the first override a newcomer tries, was refused: "train takes no
    setting 'game'"."""
    from tfaccel import api, gin_configs

    gin.clear_config()
    try:
        gin_configs.parse([config])
        assert api._override_bindings(overrides, api._trainer_name()) == bindings
    finally:
        gin.clear_config()


def test_an_unknown_override_names_the_trainers_parameters(tmp_path):
    with pytest.raises(ValueError, match=r"train takes no setting 'total_frame'; did you mean "
                       r"total_frames or"):  # fmt: skip
        tfaccel.train(["a2c.gin", "smoke.gin"], str(tmp_path / "x"), total_frame=10)
    with pytest.raises(ValueError, match=r"gin file 'nope.gin' not found"):
        tfaccel.train("nope.gin", str(tmp_path / "y"))
    # Appended to a synchronous config it was ignored: one machine trained alone, the other
    # found the directory held.
    # With a DQN config or multi_worker.gin, async.gin failed in its learners (31 and 85 lines);
    # with mirrored.gin each learner mirrored its one device.
    for configs, message in (
        (["catch_a2c.gin", "distribute/async_machines.gin"],
         r"async_machines.gin works on asynchronous learners: put --gin_file=distribute/async.gin"),
        (["catch_dqn.gin", "distribute/async.gin"], r"the DQN family has no asynchronous mode"),
        # it said to add async.gin, which the next command then refused for the DQN family
        (["catch_dqn.gin", "distribute/async_machines.gin"],
         r"async_machines.gin works on asynchronous learners: the DQN family has no asynchronous "
         r"mode: use distribute/multi_worker.gin"),
        (["catch_a3c.gin", "distribute/multi_worker.gin"],
         r"multi_worker.gin does not combine with asynchronous learners"),
        (["catch_a3c.gin", "distribute/mirrored.gin"],
         r"mirrored.gin does not combine with asynchronous learners: each learner trains on a "
         r"device of its own"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            tfaccel.train(configs, str(tmp_path / "m"))
        assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match=r"start the config list with an algorithm's config, "
                       r"e.g. categorical_dqn.gin; configs: a2c.gin"):  # fmt: skip
        tfaccel.train("smoke.gin", str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()
    run = tfaccel.train(["catch_a2c.gin", "smoke.gin"], str(tmp_path / "z"),  # gin is usable
                        "RunConfig.seed = 3")  # one binding as a string  # fmt: skip
    assert run.summary["env_frames"] >= 2_000
    assert "RunConfig.seed = 3" in open(tmp_path / "z" / "operative_config.gin").read()
    out = run.plot(str(tmp_path / "curves.png"))
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


STOPPED = """
import sys, tfaccel
try:
    tfaccel.train(["catch_a2c.gin"], sys.argv[1], total_frames=100_000_000, log_interval_frames=500)
except KeyboardInterrupt as error:
    print("KeyboardInterrupt:", error)
    raise
print("went on")
"""


def test_a_ctrl_c_stops_the_caller_after_the_run_saved(tmp_path):
    """`train` returned normally after a Ctrl-C, so a script went on to its next run."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPED, str(run_dir)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # training
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert f"KeyboardInterrupt: stopped by SIGINT; {run_dir} is saved" in out, err[-2000:]
    assert "went on" not in out
    assert list((run_dir / "checkpoints").glob("ckpt-*.index"))


def test_the_python_blocks_of_the_usage_page_run_in_order(tmp_path):
    with open(os.path.join(ROOT, "docs", "usage.md")) as handle:
        page = handle.read()
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", page, re.MULTILINE | re.DOTALL))
    assert "tfaccel.train(" in code and "tfaccel.load_policy(" in code
    code = code.replace("/tmp/", f"{tmp_path}/")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "smoke_py" / "policy" / "saved_model.pb").exists()


@pytest.mark.parametrize(
    "configs, bindings, message",
    [
        (["catch_a2c.gin"], ["A2CConfig.discount = 1.5"],
         "A2CConfig.discount must be between 0 and 1, got 1.5"),
        (["catch_a2c.gin"], ["train.make_optimizer = @make_adam", "make_adam.epsilon = -1.0"],
         "make_adam.epsilon must be a positive number (e.g. 1e-5), got -1.0"),
        (["catch_ppo.gin"], ["PPOConfig.epochs = 0"], "PPOConfig.epochs must be at least 1, got 0"),
        (["dqn.gin"], ["train_off_policy.batch_size = 0"],
         "train_off_policy.batch_size must be at least 1, got 0"),
        (["dqn.gin"], ["DQNConfig.epsilon_decay_steps = 0"],
         "DQNConfig.epsilon_decay_steps must be at least 1, got 0"),
        # trained until its first checkpoint, then "epsilon must be in [0, 1]"; with no
        # evaluation games, taken and written to the operative config
        (["catch_a2c.gin"], ["train.eval_epsilon = 5.0"],
         "train.eval_epsilon must be between 0 and 1, got 5.0"),
        (["catch_a2c.gin"], ["train.warmup_frames = -10"],
         "train.warmup_frames must be at least 0, got -10"),
        (["catch_a2c.gin"], ["A2CConfig.max_grad_norm = -1.0"],
         "A2CConfig.max_grad_norm must be at least 0, got -1.0"),
        (["dqn.gin"], ["DQNConfig.max_grad_norm = -1.0"],
         "DQNConfig.max_grad_norm must be at least 0, got -1.0"),
        # no update was ever due: "done", exit 0, nothing learnt
        (["dqn.gin"], ["train_off_policy.replay_ratio = 0.0"],
         "train_off_policy.replay_ratio must be more than 0 (gradient samples per agent step; "
         "the presets take 8), got 0.0"),
        (["dqn.gin"], ["train_off_policy.assembly_threads = 0"],
         "train_off_policy.assembly_threads must be at least 1, got 0"),
        # "capacity 5 is too small: need > (n_step + stack) * B" for a binding of 10
        (["dqn.gin"], ["train_off_policy.replay_capacity = 10"],
         "train_off_policy.replay_capacity = 10 is too small for 4 envs: give at least 24 "
         "((n_step + stack + 1) steps per env)"),
        # another algorithm's loss: an AttributeError ('clip') from inside the first update
        (["catch_a2c.gin"], ["train.loss_fn = @ppo_loss"],
         "train.loss_fn takes a PPOConfig and train.algorithm is A2CConfig: bind "
         "train.algorithm = @PPOConfig()"),
    ],
)  # fmt: skip
def test_a_value_out_of_range_is_one_line_and_leaves_no_directory(
    tmp_path, configs, bindings, message
):
    """A discount of 1.5 or Adam's epsilon of -1 trained without a word; a batch of 0 failed
    with a ZeroDivisionError once the replay had filled, leaving the run directory behind."""
    with pytest.raises(ValueError, match=re.escape(message)):
        tfaccel.train([*configs, "smoke.gin"], str(tmp_path / "run"), bindings=bindings)
    assert not (tmp_path / "run").exists()


def test_arguments_of_the_wrong_type_are_one_line_value_errors(tmp_path):
    """Each was a bare TypeError (or gin's SyntaxError), where usage.md promises a ValueError."""
    for args, message in (
        ((42, str(tmp_path / "a")), r"config must be a gin config name or path, or a list of them, got 42"),
        ((["catch_a2c.gin"], None), r"root_dir must be the directory the run goes to, got None"),
        ((["catch_a2c.gin"], str(tmp_path / "b"), [42]), r"bindings must be gin bindings: a string or"),
        ((["catch_a2c.gin", "smoke.gin"], str(tmp_path / "c"), "this is not gin"), r"^bad gin config: "),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            tfaccel.train(*args)
    with pytest.raises(ValueError, match=r"policy_dir must be a directory path, got None"):
        tfaccel.load_policy(None)
    pretrained = os.path.join(ROOT, "pretrained", "a2c_pong")
    with pytest.raises(ValueError, match=r"episodes must be an integer >= 1, got '2'"):
        evaluate.evaluate(pretrained, "2")
    with pytest.raises(ValueError, match=r"epsilon must be in \[0, 1\], got '0.1'"):
        evaluate.evaluate(pretrained, 2, epsilon="0.1")
    # An empty batch was TensorFlow's InvalidArgumentError from the first convolution.
    policy = tfaccel.load_policy(pretrained)
    out = policy(np.zeros((0, *policy.observation_shape), np.uint8))
    assert out["action"].shape == (0,) and out["action"].dtype == np.int32
    assert out["logits"].shape == (0, policy.num_actions)
