"""The loop's bookkeeping that both trainers share (`runner.Loop`): when it logs, saves and
stops, what a row holds, and what a resumed or stopped run says."""

import csv
import io
import re
import types

import pytest

from tfaccel import checkpoint, runner
from tfaccel.logger import MetricsLogger


class Team:
    """One process alone: the vote is its own flag."""

    def stop(self, flag):
        return bool(flag)

    def agent_steps(self, base_steps, local_steps):
        return base_steps + local_steps

    def tell(self, log, line):
        log.message(line)


def make_loop(tmp_path, total=1000, log_every=300, save_every=500, counters=None, **options):
    counters = counters or checkpoint.Counters()
    sampler = types.SimpleNamespace(
        seconds={"env": 1.0, "inference": 0.5},
        pool=types.SimpleNamespace(restarts=0),
        agent_steps=0,
    )
    saves = []
    log = MetricsLogger(str(tmp_path), stream=io.StringIO())
    limits = runner.RunConfig(total, log_every, save_every)
    loop = runner.Loop(counters, 4, limits, log, Team(), sampler,
                       lambda frames, wall_s: saves.append(frames), **options)  # fmt: skip
    return loop, saves, log


def rows(tmp_path):
    with open(tmp_path / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_rows_and_checkpoints_follow_their_intervals_and_the_end_is_logged_once(tmp_path):
    loop, saves, _ = make_loop(tmp_path, columns=lambda: {"epsilon": 0.5})
    stop = types.SimpleNamespace(signal_name=None)
    steps = 0
    while not loop.should_stop(stop):
        steps += 25  # 100 frames a step
        loop.advance([(1.0, 10)] if steps % 50 == 0 else [], steps, {"loss": steps / 100})
        loop.tick()
    summary = loop.finish(stop)
    table = rows(tmp_path)
    assert [int(row["env_frames"]) for row in table] == [300, 600, 900, 1000]
    assert saves == [500, 1000]  # 500 (its interval), then the end
    assert table[-1]["epsilon"] == "0.5" and table[-1]["loss"] == "2.5"
    assert int(table[-1]["episodes"]) == 5 and int(table[-1]["agent_steps"]) == 250
    assert summary["env_frames"] == 1000 and summary["final_score"] == 1.0
    assert summary["stopped_by"] is None and summary["loss"] == 2.5
    assert int(loop.counters.agent_steps) == 250  # what a resume starts from


def test_a_stop_signal_saves_once_and_says_how_to_resume(tmp_path):
    loop, saves, log = make_loop(tmp_path)
    stop = types.SimpleNamespace(signal_name=None)
    loop.advance([], 100)  # 400 frames: a row at 300 is due, a checkpoint is not
    loop.tick()
    stop.signal_name = "SIGINT"
    assert loop.should_stop(stop)
    summary = loop.finish(stop)
    assert saves == [400] and summary["stopped_by"] == "SIGINT"
    assert [int(row["env_frames"]) for row in rows(tmp_path)] == [400]
    assert "stopped by SIGINT at 400 frames; checkpoint saved" in log._stream.getvalue()


class VotedStop(Team):
    """Another process of the run voted to stop."""

    def stop(self, flag):
        return True


def test_a_stop_at_the_wall_limit_or_by_another_process_says_so(tmp_path):
    """Both ended like a finished run: `stopped_by` None and no line, at 400 of 1,000 frames."""
    loop, saves, log = make_loop(tmp_path / "wall")
    loop.settings = runner.RunConfig(1000, 300, 500, max_wall_seconds=1e-9)  # already past
    loop.advance([], 100)
    stop = types.SimpleNamespace(signal_name=None)
    assert loop.should_stop(stop)
    assert loop.finish(stop)["stopped_by"] == "max_wall_seconds" and saves == [400]
    assert (
        "stopped at the wall limit (RunConfig.max_wall_seconds = 1e-09) at 400 frames; checkpoint "
        "saved: run the same command to resume" in log._stream.getvalue()
    )
    loop, _, log = make_loop(tmp_path / "team")
    loop._team = VotedStop()
    loop.advance([], 100)
    assert loop.should_stop(stop) and loop.finish(stop)["stopped_by"] == "another process"
    assert "stopped with another process of the run at 400 frames" in log._stream.getvalue()


class LastStepsElsewhere(VotedStop):
    """Another process added its last steps after this one counted, then voted to stop."""

    def agent_steps(self, base_steps, local_steps):
        return base_steps + local_steps + 260


def test_the_steps_another_process_added_before_the_stop_are_in_the_last_row(tmp_path):
    loop, saves, _ = make_loop(tmp_path)
    loop._team = LastStepsElsewhere()
    loop.advance([], 240)  # 960 frames when this process counted
    stop = types.SimpleNamespace(signal_name=None)
    assert loop.should_stop(stop)
    summary = loop.finish(stop)
    assert int(rows(tmp_path)[-1]["env_frames"]) == 1040 and saves == [1040]
    assert summary["env_frames"] == 1040 and summary["stopped_by"] is None  # it is complete
    assert int(loop.counters.agent_steps) == 260  # a resume does not take them again


def test_a_resumed_run_counts_on_and_a_complete_one_says_so(tmp_path):
    counters = checkpoint.Counters()
    counters.agent_steps.assign(250)  # 1000 frames: the run's total
    counters.remember_scores([3.0, 5.0])
    loop, saves, log = make_loop(tmp_path, counters=counters)
    assert loop.frames == loop.last_log == loop.last_save == 1000
    assert loop.complete()
    assert "raise RunConfig.total_frames to go on" in log._stream.getvalue()
    summary = loop.finish(types.SimpleNamespace(signal_name=None))
    assert saves == [] and summary["final_score"] == 4.0  # the remembered scores
    longer, _, _ = make_loop(tmp_path / "more", total=2000, counters=counters)
    assert not longer.complete()


def test_a_pool_larger_than_the_memory_available_is_one_line():
    runner.check_pool_memory(2, 16, available=8 * 2**30)  # 2 x 48 + 32 MiB: fits
    with pytest.raises(ValueError, match=re.escape(
        "2,000 env workers of 64 envs need about 218.8 GiB of memory and this machine has 8.0 GiB "
        "available: use fewer workers (PoolConfig.num_workers)"
    )):  # fmt: skip
        runner.check_pool_memory(2000, 64, available=8 * 2**30)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(total_frames=0), "RunConfig.total_frames must be a positive number of env frames, got 0"),
        (dict(seed=-5), "RunConfig.seed must be 0 or more, got -5"),  # numpy's words, unnamed
        (dict(total_frames=-5), "RunConfig.total_frames must be a positive number of env frames, got -5"),
        (dict(checkpoint_interval_frames=0), "RunConfig.checkpoint_interval_frames must be a positive"),
        (dict(log_interval_frames=-1), "RunConfig.log_interval_frames must be a positive"),
        (dict(eval_episodes=-1), "RunConfig.eval_episodes must be 0 or more, got -1"),
        # gin leaves None alone: it was a TypeError from the comparison
        (dict(seed=None), "RunConfig.seed must be an int, got None (NoneType)"),
        (dict(total_frames=None), "RunConfig.total_frames must be an int, got None"),
        (dict(max_wall_seconds="60"), "RunConfig.max_wall_seconds must be a number, got '60'"),
    ],
)  # fmt: skip
def test_run_settings_out_of_range_are_named(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        runner.RunConfig(**settings)


@pytest.mark.parametrize(
    "layout, message",
    [
        (dict(envs_per_worker=3), "PoolConfig.envs_per_worker (3) must split evenly into "
                                  "PoolConfig.num_groups (2) groups: give a multiple of 2"),
        (dict(num_workers=-1), "PoolConfig.num_workers must be 0 or more and PoolConfig.envs_per_worker 1 or more, got -1 and 8"),
        (dict(envs_per_worker=0), "PoolConfig.envs_per_worker 1 or more, got 2 and 0"),
        (dict(num_groups=3, envs_per_worker=6), "PoolConfig.num_groups must be 1 or 2, got 3"),
        (dict(num_workers=None), "PoolConfig.num_workers must be an int, got None (NoneType)"),
        # -5 ran the workers ahead of the learner (or failed to start them, blaming the env)
        (dict(worker_niceness=-5), "PoolConfig.worker_niceness must be between 0 and 19, got -5"),
        (dict(worker_niceness=50), "PoolConfig.worker_niceness must be between 0 and 19, got 50"),
        # 0 and -1 said "worker 0 did not answer within -1 s: hung?; fix the env"
        (dict(timeout=0.0), "PoolConfig.timeout must be more than 0 seconds, got 0.0"),
        (dict(timeout=float("nan")), "PoolConfig.timeout must be more than 0 seconds, got nan"),
        (dict(restart_window=-1.0), "PoolConfig.restart_window must be more than 0 seconds"),
        (dict(max_restarts=-1), "PoolConfig.max_restarts must be at least 0, got -1"),
    ],
)  # fmt: skip
def test_pool_layouts_that_cannot_be_made_name_the_binding(layout, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        runner.PoolConfig(**layout)
    assert runner.PoolConfig(num_workers=0, envs_per_worker=3, num_groups=1).group_size == 3


@pytest.mark.parametrize(
    "background, line",
    [
        (87 / 255, "frames are offset by the game's background pixel, 0.3412"),  # Pong
        (0.0, "frames are not offset: the game's background is black"),  # was "..., 0.0000"
    ],
)
def test_the_background_line_says_what_was_done_to_the_frames(monkeypatch, background, line):
    from tests.test_networks import SPEC
    from tfaccel.networks import PolicyValueNetwork, a3c_torso

    said = []
    monkeypatch.setattr(runner, "background_pixel", lambda env, seed: background)
    network = PolicyValueNetwork(SPEC, torso=lambda: a3c_torso(subtract_background=True))
    runner.set_frame_offsets([network], None, 0, types.SimpleNamespace(message=said.append))
    assert said == [line]
    # A resume keeps its checkpoint's offset: a black game's 0 was measured and said again.
    fresh = PolicyValueNetwork(SPEC, torso=lambda: a3c_torso(subtract_background=True))
    log = types.SimpleNamespace(message=said.append)
    runner.set_frame_offsets([fresh], None, 0, log, resumed=True)
    assert said == [line] and float(fresh.torso.layers[0].offset.numpy()) == 0.0
