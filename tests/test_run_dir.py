"""Resuming a run directory: its settings read as text, and what changed since."""

import contextlib
import errno
import io
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import gin
import pytest

from tests.fakes import Log
from tfaccel import run_dir
from tfaccel.logger import MetricsLogger

BEFORE = """
# Parameters for nature_torso:
nature_torso.center_frames = False
train_off_policy.torso = @nature_torso
train_off_policy.learning_rate = 0.00071
train_off_policy.schedule = [1, 2,
    3]
eval/train.eval_epsilon = 0.001
"""


def test_gin_settings_reads_scopes_references_and_values_spanning_lines():
    settings = run_dir.gin_settings(BEFORE)
    assert settings == {
        "nature_torso.center_frames": False,
        "train_off_policy.torso": "@nature_torso",
        "train_off_policy.learning_rate": 0.00071,
        "train_off_policy.schedule": [1, 2, 3],
        "eval/train.eval_epsilon": 0.001,
    }


def test_changed_settings_names_each_changed_added_and_dropped_binding():
    after = (
        BEFORE.replace("center_frames = False", "center_frames = True")
        .replace("eval/train.eval_epsilon = 0.001\n", "")
        .replace("@nature_torso", "@nature_torso()")
        + "RunConfig.total_frames = 20_000_000\n"
    )
    assert run_dir.changed_settings(BEFORE, after) == [
        "RunConfig.total_frames: unset -> 20000000",
        "eval/train.eval_epsilon: 0.001 -> unset",
        "nature_torso.center_frames: False -> True",
        "train_off_policy.torso: '@nature_torso' -> '@nature_torso()'",
    ]
    assert run_dir.changed_settings(BEFORE, BEFORE + "\n# a comment\n") == []


def test_an_operative_config_of_an_earlier_version_is_read_under_the_current_names():
    # Written before the shared settings moved to RunConfig and PoolConfig: the same run.
    before = "train.total_frames = 1000\ntrain.num_workers = 2\nmake_pool.timeout = 60.0\n"
    after = "RunConfig.total_frames = 1000\nPoolConfig.num_workers = 2\nPoolConfig.timeout = 60.0\n"
    assert run_dir.changed_settings(before, after) == []
    assert run_dir.changed_settings(before, after.replace("1000", "2000")) == [
        "RunConfig.total_frames: 1000 -> 2000"
    ]


def test_a_resume_keeps_the_previous_settings_and_warns_only_when_they_changed(tmp_path):
    path = tmp_path / "operative_config.gin"
    log = Log()
    path.write_text(BEFORE)
    run_dir.note_changed_settings(str(path), BEFORE, 4000, log)
    assert log.messages == [] and path.read_text() == BEFORE  # the same settings: nothing to say
    run_dir.note_changed_settings(str(path), BEFORE.replace("0.00071", "0.0005"), 4000, log)
    assert not path.exists() and (tmp_path / "operative_config.4000.gin").read_text() == BEFORE
    assert log.messages[0].endswith("train_off_policy.learning_rate: 0.00071 -> 0.0005")
    path.write_text("train_off_policy.learning_rate = (")  # cut off mid-value
    run_dir.note_changed_settings(str(path), BEFORE, 8000, log)
    assert "are not readable gin" in log.messages[1]
    assert (tmp_path / "operative_config.8000.gin").exists()
    second = BEFORE.replace("0.00071", "0.0005")  # resumed at 4000 frames again, then changed
    path.write_text(second)
    run_dir.note_changed_settings(str(path), BEFORE.replace("False", "True"), 4000, log)
    assert (tmp_path / "operative_config.4000.gin").read_text() == BEFORE  # the first, kept
    assert (tmp_path / "operative_config.4000-2.gin").read_text() == second
    assert "operative_config.4000-2.gin" in log.messages[2]


@contextlib.contextmanager
def locked_by_another_process(path):
    """A process that holds the lock of the run directory `path` until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"from tfaccel import run_dir; run_dir.take_lock({str(path)!r}); print('held', "
         "flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_a_run_directory_held_by_another_process_is_refused_naming_it(tmp_path):
    with locked_by_another_process(tmp_path) as holder:
        with pytest.raises(
            ValueError, match=rf"is being trained by another process \(pid {holder.pid}:"
        ):
            run_dir.take_lock(str(tmp_path))
    run_dir.take_lock(str(tmp_path))  # its process gone, the lock went with it
    run_dir.take_lock(str(tmp_path))  # this process again (a second run in one kernel): fine
    assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()}: ")
    run_dir.release_lock(str(tmp_path))


def test_an_asynchronous_learners_lock_names_its_launcher_first(tmp_path, monkeypatch):
    # The launcher is the command the user started and stops; the learner's own pid follows.
    monkeypatch.setattr(run_dir, "launcher_pid", 4321)
    run_dir.take_lock(str(tmp_path))
    try:
        text = (tmp_path / ".lock").read_text().strip()
        assert text.startswith("pid 4321: ") and text.endswith(f"; its learner pid {os.getpid()}")
    finally:
        run_dir.release_lock(str(tmp_path))


def test_a_run_directory_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def refused(path, *args):  # as a read-only mount or another user's directory answers
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(
        ValueError, match=r"cannot write to the run directory .* \(Permission denied\)"
    ):
        run_dir.take_lock(str(tmp_path))


def test_a_full_disk_at_the_lock_is_one_line_and_the_directory_made_is_removed(
    tmp_path, monkeypatch
):
    """It was `error: [Errno 28] No space left on device`, naming no path, and the directory
    stayed: this process kept the lock it could not write, so the clean-up found it held."""
    made = tmp_path / "run"
    made.mkdir()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", full)
        with pytest.raises(ValueError, match=re.escape(
            f"cannot write to the run directory {made} (No space left on device): free some "
            "space, or give a --root_dir on another disk"
        )):  # fmt: skip
            run_dir.take_lock(str(made))
    assert run_dir.remove_if_unused(str(made)) and not made.exists()


def test_a_root_dir_that_is_empty_a_file_or_not_creatable_is_named(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--root_dir is empty"):
        run_dir.make_run_dir("")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"afile is a file, not a directory"):
        run_dir.make_run_dir(str(tmp_path / "afile"))
    with pytest.raises(ValueError, match=r"afile/run .*\(Not a directory\)"):
        run_dir.make_run_dir(str(tmp_path / "afile" / "run"))

    def refused(path, *args, **kwargs):  # a read-only mount answers so
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(os, "mkdir", refused)
    with pytest.raises(ValueError, match=r"cannot write to the run directory .*Read-only"):
        run_dir.make_run_dir(str(tmp_path / "new" / "run"))
    run_dir.make_run_dir(str(tmp_path))  # an existing directory is fine


def test_only_a_run_directory_with_nothing_trained_is_removed(tmp_path):
    empty = tmp_path / "empty"
    (empty / "tb").mkdir(parents=True)
    (empty / "metrics.csv").write_text("env_frames,agent_steps\n")
    assert run_dir.remove_if_unused(str(empty)) and not empty.exists()
    logged = tmp_path / "logged" / "learner-1"
    logged.mkdir(parents=True)
    (logged / "metrics.csv").write_text("env_frames,agent_steps\n400,100\n")
    assert not run_dir.remove_if_unused(str(tmp_path / "logged"))
    saved = tmp_path / "saved" / "checkpoints"
    saved.mkdir(parents=True)
    (saved / "checkpoint").write_text('model_checkpoint_path: "ckpt-400"\n')
    assert not run_dir.remove_if_unused(str(tmp_path / "saved")) and saved.exists()


class _Alone:
    """The team of a run trained by this process alone (`strategies.SyncTeam`'s two answers)."""

    chief = True

    def run_dir(self, root_dir):
        return root_dir


@pytest.mark.parametrize("existed", [False, True])
def test_a_run_that_fails_at_its_start_leaves_no_directory_it_made(tmp_path, existed):
    """`on_policy.train` called from a script whose env the workers cannot import fails after
    the run directory was opened: the directory it made goes; one that was there stays."""
    root = tmp_path / "run"
    if existed:
        root.mkdir()
    opened = run_dir.open_run(str(root), _Alone(), "precision float32")[0]
    with pytest.raises(ValueError, match="defined in __main__"):
        with run_dir.held(opened):
            raise ValueError("the env factory is defined in __main__")
    assert root.exists() == existed
    run_dir.open_run(str(root), _Alone(), "precision float32")  # the lock was let go
    with run_dir.held(str(root)):
        pass  # a run that ends well keeps its directory
    assert root.exists()


def test_a_stop_while_the_run_directory_opens_leaves_no_directory(tmp_path, monkeypatch):
    """A SIGTERM (raised as a KeyboardInterrupt) after the directory and tb/ were made, but
    before `held` took over, left them behind; the lock was let go too."""
    from tfaccel import networks
    from tfaccel.commands import Terminated

    def stopped():
        raise Terminated()

    monkeypatch.setattr(networks, "precision_warning", stopped)
    with pytest.raises(Terminated):
        run_dir.open_run(str(tmp_path / "run"), _Alone(), "precision float32")
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    run_dir.open_run(str(tmp_path / "run"), _Alone(), "precision float32")  # free again
    with run_dir.held(str(tmp_path / "run")):
        pass


def test_a_run_directory_another_process_trains_is_not_removed(tmp_path):
    """A multi-worker worker that fails at its start must not remove the directory its chief
    has just made and trains in (the chief holds its lock, and has logged nothing yet)."""
    with locked_by_another_process(tmp_path):
        assert not run_dir.remove_if_unused(str(tmp_path)) and tmp_path.exists()
    assert run_dir.remove_if_unused(str(tmp_path)) and not tmp_path.exists()
    assert not run_dir.remove_if_unused(str(tmp_path))  # gone already: nothing to do


class _Worker:
    """The team of a multi-worker run's worker 1 (`strategies.SyncTeam`), which writes below
    its chief's directory."""

    chief = False

    def run_dir(self, root_dir):
        return os.path.join(root_dir, "worker-1")


def test_a_worker_that_fails_at_its_start_removes_the_root_it_made_unless_its_chief_trains(
    tmp_path,
):
    root = tmp_path / "run"
    opened = run_dir.open_run(str(root), _Worker(), "precision float32")[0]
    with pytest.raises(ValueError), run_dir.held(opened):
        raise ValueError("a batch that does not split")
    assert not root.exists()  # it made both root and root/worker-1: both go
    opened = run_dir.open_run(str(root), _Worker(), "precision float32")[0]
    with locked_by_another_process(root):  # the chief started meanwhile and trains root
        with pytest.raises(ValueError), run_dir.held(opened):
            raise ValueError("a batch that does not split")
        assert root.exists() and not (root / "worker-1").exists()


def test_a_directory_with_a_run_another_process_trains_below_it_is_not_removed(tmp_path):
    """An asynchronous learner still stopping holds `root/learner-1`: root stays."""
    (tmp_path / "learner-1").mkdir()
    with locked_by_another_process(tmp_path / "learner-1"):
        assert not run_dir.remove_if_unused(str(tmp_path)) and tmp_path.exists()
    assert run_dir.remove_if_unused(str(tmp_path)) and not tmp_path.exists()


def test_a_run_directory_is_free_again_once_its_training_ends(tmp_path):
    """A notebook kernel that trained a run must not keep it from a command in a terminal."""
    run_dir.take_lock(str(tmp_path))
    with run_dir.held(str(tmp_path)):
        pass
    with locked_by_another_process(tmp_path) as holder:  # it took the lock: free
        assert holder.poll() is None


def test_a_filesystem_without_locks_trains_unguarded(tmp_path, monkeypatch):
    """Some network mounts refuse flock (ENOLCK): that must not stop a run."""
    import errno
    import fcntl

    def refused(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    run_dir.take_lock(str(tmp_path))  # no error
    assert os.path.realpath(tmp_path) not in run_dir._held


def test_the_commands_resume_hint_finds_a_checkpoint_of_any_process_of_the_run(tmp_path):
    from tfaccel.commands.train import _has_checkpoint

    root = tmp_path / "run[1]"  # glob characters in the path are taken literally
    assert not _has_checkpoint(str(root))
    (root / "checkpoints").mkdir(parents=True)
    assert not _has_checkpoint(str(root))  # an empty checkpoints directory is not a checkpoint
    for below in ("", "worker-1", "machine-1/learner-1"):
        place = tmp_path / f"copy{len(below)}"
        (place / below / "checkpoints").mkdir(parents=True)
        (place / below / "checkpoints" / "checkpoint").write_text("")
        assert _has_checkpoint(str(place)), below


def test_evaluations_asked_of_a_non_atari_env_are_refused_with_a_warning():
    """`RunConfig.eval_episodes = 2` on Catch was ignored without a word."""
    from tfaccel.envs.atari import AtariConfig
    from tfaccel.envs.toy import CatchConfig

    log = Log()
    said = log.messages
    pong = AtariConfig(game="pong")
    assert run_dir.atari_of(pong, 2, log) is pong and said == []
    assert run_dir.atari_of(CatchConfig(), 0, log) is None and said == []  # none asked for
    assert run_dir.atari_of(CatchConfig(), 2, log) is None
    assert said == [
        "warning: RunConfig.eval_episodes = 2 is ignored: evaluation plays Atari games only (the "
        "metrics' episode_return_raw_mean is this env's score)"
    ]
    assert run_dir.atari_of(CatchConfig(), 2, False) is None  # not the chief: nothing to say


@gin.configurable
def _pending_loss(network=None, scale=1.0, floor=0.0):
    return scale, floor


def test_the_settings_of_a_configurable_not_called_yet_keep_their_macros(tmp_path):
    """A loss's settings are called in its first update, after the file is written: they are
    recorded from the bindings, with the macros they use (a changed macro went unnoticed)."""
    with gin.unlock_config():
        gin.clear_config()
        gin.parse_config("SCALE = 0.5\n_pending_loss.scale = %SCALE\n_pending_loss.floor = 0.1")
    try:
        written = run_dir.run_settings()
    finally:
        gin.clear_config()
    assert written.lstrip("\n").split("\n")[0] == f"{run_dir.PENDING} (a configurable loss's settings, called " \
        "in its first update):"  # fmt: skip
    settings = run_dir.gin_settings(written)
    assert settings["_pending_loss.scale"] == "%SCALE" and settings["%SCALE"] == 0.5
    assert settings["_pending_loss.floor"] == 0.1
    # A run whose file predates the section: its first resume finds no change in it.
    path, log = tmp_path / "operative_config.gin", Log()
    path.write_text(BEFORE)
    run_dir.note_changed_settings(str(path), BEFORE + "\n" + written, 4000, log)
    assert log.messages == [] and path.read_text() == BEFORE
    path.write_text(BEFORE + "\n" + written)  # with the section: a changed macro is a change
    run_dir.note_changed_settings(
        str(path), BEFORE + "\n" + written.replace("0.5", "0.25"), 4000, log
    )
    assert log.messages[0].endswith("%SCALE: 0.5 -> 0.25")


def test_another_algorithm_is_named_and_an_emptied_config_is_not_one(tmp_path):
    """An empty `operative_config.gin` (a crash or a full disk leaves one) was read as a run of
    another algorithm, `()`, and the run could not resume."""
    a2c = "run.trainer = @train\ntrain.loss_fn = @a2c_loss\ntrain.torso = @a3c_torso\n"
    dqn = "run.trainer = @train_off_policy\ntrain_off_policy.torso = @nature_torso\n"
    path = tmp_path / "operative_config.gin"
    path.write_text(a2c)
    run_dir.check_same_algorithm(str(tmp_path), a2c)
    with pytest.raises(ValueError, match=r"holds a run of another algorithm or network \(run"
                       r".trainer = @train, train.loss_fn = @a2c_loss"):  # fmt: skip
        run_dir.check_same_algorithm(str(tmp_path), dqn)
    for damaged in ("", a2c[:10]):  # emptied, or cut inside its first setting
        path.write_text(damaged)
        run_dir.check_same_algorithm(str(tmp_path), a2c)


@pytest.mark.parametrize("emptied", [True, False])
def test_a_resume_whose_metrics_were_emptied_says_the_curve_starts_again(tmp_path, emptied):
    """A zero-length metrics.csv (a full disk, a hand edit) resumed without a word."""

    class Saver:
        skipped = []

        def restore(self):
            return str(tmp_path / "checkpoints" / "ckpt-3")

    (tmp_path / "metrics.csv").write_text("" if emptied else "env_frames,agent_steps\n400,100\n")
    screen = io.StringIO()
    log = MetricsLogger(str(tmp_path), stream=screen)
    counters = SimpleNamespace(agent_steps=1000)
    run_dir.resume(Saver(), str(tmp_path), [log], counters, 4, SimpleNamespace())
    warning = f"warning: {log.path} has no rows at or before the checkpoint's 4,000 frames: "
    assert (warning + "the curve starts there" in screen.getvalue()) == emptied
    assert "resumed from" in screen.getvalue()


@pytest.mark.parametrize("loop_started", [False, True])
def test_a_sigterm_outside_the_loop_says_whether_the_run_had_saved(monkeypatch, capsys,
                                                                  loop_started):  # fmt: skip
    """After the loop (closing the pool, printing the summary) a SIGTERM said `while starting:
    nothing was trained`, though the run had saved its checkpoint."""
    from tfaccel.commands import Terminated
    from tfaccel.commands import train as command
    from tfaccel.guards import StopRequest

    def main():
        if loop_started:
            with StopRequest():
                pass
        raise Terminated()

    monkeypatch.setattr(StopRequest, "entered", False)
    monkeypatch.setattr(command.commands, "raise_on_sigterm", lambda: None)
    monkeypatch.setattr(command, "main", main)
    with pytest.raises(SystemExit) as ended:
        command.run()
    assert ended.value.code == 143
    said = capsys.readouterr().err.strip()
    assert said == "stopped by SIGTERM " + (
        "while the run closed: its checkpoint is saved" if loop_started
        else "while starting: nothing was trained"
    )  # fmt: skip
