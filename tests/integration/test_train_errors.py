"""bin/train given bad input: each user error ends with one line that names the problem and
what is valid, and leaves nothing behind."""

import signal
import subprocess
import sys
import time

import pytest

from tests.fakes import as_from_a_terminal
from tests.integration.commands import ROOT, SMOKE, logged_frames, rows, train


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--gin_bindings=RunConfig.totl_frames = 1"],
            "bad gin config: RunConfig has no parameter 'totl_frames'; did you mean total_frames",
        ),
        (
            [
                "--gin_bindings=train.torso = @nature_torso",
                "--gin_bindings=train.env = @CatchConfig()",
            ],
            "the torso nature_torso does not fit this env's observations (uint8 [44, 20, 1])",
        ),
        (
            ["--gin_bindings=AtariConfig.game = 'pongg'"],
            "unknown Atari game 'pongg'; closest valid names: pong",
        ),
        (
            ["--gin_file=no_such.gin"],
            "gin file 'no_such.gin' not found; configs in gin_configs/: a2c.gin",
        ),
        (["--gin_bindings=PoolConfig.num_groups = 3"], "num_groups must be 1 or 2, got 3"),
        (  # it trained, climbing the loss
            ["--gin_bindings=train.learning_rate = -1e-3"],
            "train.learning_rate must be a positive number (e.g. 7e-4), got -0.001",
        ),
        (
            ["--gin_bindings=A2CConfig.entropy_cost = '0.01'"],
            "A2CConfig.entropy_cost = '0.01': it must be a float",
        ),
        (
            ["--gin_file=catch_ppo.gin", "--gin_bindings=PPOConfig.minibatches = 5"],
            "a rollout of 128 samples per replica (train.horizon 16 x 8 envs: "
            "PoolConfig.num_workers x envs_per_worker / num_groups) does not split into "
            "PPOConfig.minibatches = 5",
        ),
        (
            ["--gin_file=distribute/mirrored.gin", "--gin_bindings=make_strategy.logical_cpus = 3"],
            "the number of envs per group is 2, which does not split among 3 replicas",
        ),
        (
            ["--gin_bindings=make_strategy.kind = 'multi_worker'"],
            "make_strategy.kind = 'multi_worker' needs TF_CONFIG",
        ),
        (
            ["--gin_bindings=make_strategy.kind = 'ps'"],
            "valid kinds: default, mirrored, multi_worker",
        ),
        (
            ["--gin_bindings=import no_such_module_here"],
            "No module named 'no_such_module_here': put its directory on PYTHONPATH",
        ),
        (
            [
                "--gin_file=catch_dqn.gin",
                "--gin_bindings=train_off_policy.replay_capacity = 1_000_000_000_000",
            ],
            "available: lower train_off_policy.replay_capacity",
        ),
        (
            ["--gin_file=catch_dqn.gin", "--gin_bindings=train_off_policy.batch_size = 65"],
            "train_off_policy.batch_size = 65 does not split into 2 equal shares",
        ),
        (
            [
                "--gin_file=catch_dqn.gin",
                "--gin_bindings=train_off_policy.replay_capacity = 1_000",
            ],
            "train_off_policy.min_replay_steps = 1,000 is never reached: a replay of 1,000 "
            "transitions on 8 envs holds at most",
        ),
        (
            ["--gin_file=catch_dqn.gin", "--gin_bindings=CatchConfig.vector = True"],
            "the replay stores uint8 frames [H, W, stack], one frame per step; this env observes "
            "float32 [3]",
        ),
        (
            ["--gin_bindings=PoolConfig.envs_per_worker = 0"],
            "PoolConfig.envs_per_worker 1 or more, got 1 and 0",
        ),
        (
            ["--gin_bindings=set_precision.policy = 'float16'"],
            "unknown precision 'float16'; valid: auto, float32, mixed_bfloat16",
        ),
        (
            ["--gin_bindings=RunConfig.on_nonfinite = 'ignore'"],
            "on_nonfinite must be one of ('skip', 'restore', 'stop'), got 'ignore'",
        ),
        (  # wrong types were a TypeError traceback
            ['--gin_bindings=PoolConfig.envs_per_worker = "four"'],
            "PoolConfig.envs_per_worker = 'four': it must be an int",
        ),
        (
            ["--gin_bindings=PoolConfig.num_workers = 2.5"],
            "PoolConfig.num_workers = 2.5: it must be an int",
        ),
        (  # gin's check leaves None alone: it was a 45-line TypeError
            ["--gin_bindings=RunConfig.seed = None"],
            "RunConfig.seed must be an int, got None (NoneType)",
        ),
        (
            ["--gin_bindings=trian.total_frames = 5"],  # a misspelt configurable
            "no configurable named 'trian'; did you mean train? configurables: ",
        ),
        (  # the replay's batch under the mirrored strategy
            [
                "--gin_file=catch_dqn.gin",
                "--gin_file=distribute/mirrored.gin",
                "--gin_bindings=make_strategy.logical_cpus = 3",
            ],
            "train_off_policy.batch_size is 64, which does not split among 3 replicas",
        ),  # fmt: skip
        (  # an oversized layout was an OOM kill of some process, with no word
            ["--gin_bindings=PoolConfig.num_workers = 100_000"],
            "100,000 env workers of 4 envs need about",
        ),
        (
            ["--gin_bindings=train.env = 42"],
            "train.env = 42: it takes a reference to a function or factory, e.g. @AtariConfig()",
        ),
        (
            ["--gin_file=ppo.gin"],  # a second algorithm after a2c.gin: the last won, silently
            "two algorithm configs, a2c.gin and ppo.gin: give one",
        ),
    ],
)
def test_user_errors_end_with_one_line(tmp_path, args, message):
    toy = any(arg.startswith("--gin_file=catch") for arg in args)  # an algorithm config itself
    result = train(tmp_path / "run", *([] if toy else SMOKE), *args, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing trained: no run directory left behind


def test_a_second_command_on_a_run_directory_in_training_stops_with_one_line(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}", *SMOKE,
         "--gin_bindings=RunConfig.total_frames = 10_000_000"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not logged_frames(tmp_path):
            assert time.time() < deadline and first.poll() is None, first.stderr.read()
            time.sleep(0.5)
        rows_before = len(rows(tmp_path))
        second = train(tmp_path, *SMOKE, timeout=120)
        assert second.returncode == 1, second.stderr[-2000:]
        last = second.stderr.strip().splitlines()[-1]
        assert f"{tmp_path} is being trained by another process (pid {first.pid}:" in last, last
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first goes on, its log its own
        assert len(rows(tmp_path)) >= rows_before
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(120)
    again = train(tmp_path, *SMOKE, "--gin_bindings=RunConfig.total_frames = 1")  # the lock is free
    assert again.returncode == 0 and "the run is complete" in again.stdout, again.stderr[-2000:]


def test_no_algorithm_config_or_a_file_as_run_directory_ends_with_one_line(tmp_path):
    alone = train(tmp_path / "run", "--gin_file=smoke.gin", timeout=120)
    assert alone.returncode != 0 and "Traceback" not in alone.stderr
    assert "start the --gin_file list with an algorithm's config" in alone.stderr
    assert "configs: a2c.gin" in alone.stderr.strip().splitlines()[-1]
    (tmp_path / "a_file").write_text("")
    on_a_file = train(tmp_path / "a_file", *SMOKE, timeout=120)
    assert on_a_file.returncode != 0 and "Traceback" not in on_a_file.stderr
    assert str(tmp_path / "a_file") in on_a_file.stderr.strip().splitlines()[-1]


def test_resuming_with_another_algorithm_is_one_line_naming_both(tmp_path):
    """It ended with a tensor-shape error from deep inside the checkpoint's restore."""
    first = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin")
    assert first.returncode == 0, first.stderr[-3000:]
    other = train(tmp_path, "--gin_file=catch_dqn.gin", "--gin_file=smoke.gin")
    assert other.returncode == 1 and "Traceback" not in other.stderr
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path} holds a run of another algorithm or network")
    assert "train.loss_fn = @a2c_loss" in line and "run.trainer = @train_off_policy" in line
    same = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                 "--gin_bindings=RunConfig.total_frames = 2800")  # fmt: skip
    assert same.returncode == 0, same.stderr[-3000:]


def test_resuming_with_settings_that_change_the_variables_names_them(tmp_path):
    """A schedule where the run had a constant rate (the optimizer loses a variable) ended with
    "no checkpoint can be restored ...: move the directory away", and a screen of warnings."""
    first = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin")
    assert first.returncode == 0, first.stderr[-3000:]
    other = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                  "--gin_bindings=train.decay_learning_rate = True")  # fmt: skip
    assert other.returncode == 1 and "Traceback" not in other.stderr
    (line,) = [line for line in other.stderr.strip().splitlines() if "precision" not in line]
    assert line.startswith(f"error: the checkpoints of {tmp_path} do not fit"), line
    assert "train.decay_learning_rate: False -> True" in line and "new --root_dir" in line
    same = train(tmp_path, "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
                 "--gin_bindings=RunConfig.total_frames = 2800")  # fmt: skip
    assert same.returncode == 0, same.stderr[-3000:]
