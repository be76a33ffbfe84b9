"""The run directory: opening it, resuming from it (the operative config, its changes, the
checkpoint, the logs rewound to it) and publishing the policy into it.

Resuming reads a run's earlier `operative_config.gin` as text, without the configurables it
names registered, so a run directory written by an older version is read, not re-parsed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import time
import tokenize

import gin
from gin import config_parser

from tfaccel import checkpoint, evaluate, export, gin_configs, networks
from tfaccel.envs.atari import AtariConfig
from tfaccel.logger import MetricsLogger


def open_run(
    root_dir: str, team, precision: str, devices: str = ""
) -> tuple[str, MetricsLogger, MetricsLogger]:
    """This process's run directory (created) and its metrics and eval loggers; only the chief
    of the processes training together shows progress. The log starts with the `precision`
    line (`networks.set_precision`), a warning if this machine only emulates it, and the
    `devices` line (`strategies.describe`)."""
    run_dir = team.run_dir(root_dir)
    if (top := _topmost_missing(run_dir)) is not None:
        _created[os.path.realpath(run_dir)] = top
    make_run_dir(run_dir)
    try:
        take_lock(run_dir)
        quiet = None if team.chief else open(os.devnull, "w")
        log = MetricsLogger(run_dir, stream=quiet)
        log.message(precision)
        if warning := networks.precision_warning():
            log.message(f"warning: {warning}")
        if devices:
            log.message(devices)
        return run_dir, log, MetricsLogger(run_dir, "eval", stream=quiet)
    except BaseException:  # a signal or an error before `held` takes over: the same clean-up
        _let_go(run_dir, failed=True)
        raise


def _topmost_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (None: `path` exists), the one
    `make_run_dir` creates first: `root_dir` itself for a multi-worker worker that starts before
    its chief and makes `root_dir/worker-<i>`."""
    path, top = os.path.abspath(path), None
    while path and not os.path.exists(path):
        path, top = os.path.dirname(path), path
    return top


def make_run_dir(run_dir: str) -> None:
    """Creates `run_dir` (and its parents) if it does not exist.

    Raises:
        ValueError: one line, when the path is empty, names a file, or cannot be created.
    """
    if not run_dir:
        raise ValueError("--root_dir is empty: give the directory the run goes to")
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ValueError(f"--root_dir {run_dir} is a file, not a directory: give a directory")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"cannot write to the run directory {run_dir} ({error.strerror}): give a --root_dir "
            "this user can write to, or make it writable"
        ) from None


LOCK = ".lock"  # in a run directory: the pid of the process that trains it
_held: dict[str, int] = {}  # run directory (real path) -> the open lock file this process holds
_created: dict[str, str] = {}  # run directory open_run made (real path) -> topmost one it made
# The process a lock names, when it is not the one that holds it: an asynchronous learner names
# its launcher, the command the user started (and stops: it forwards the signal to its learners).
launcher_pid: int | None = None


def take_lock(run_dir: str) -> None:
    """Takes the run directory's lock for this process (until it exits), so that a second
    command on the same directory (a scheduler's requeue while the first job still runs, a
    second terminal) stops at once instead of interleaving its rows and checkpoints with the
    first's. An advisory `flock`: the kernel drops it when the process dies, however it dies.

    Raises:
        ValueError: another process holds it (naming that process), or the directory cannot be
            written.
    """
    import fcntl

    key = os.path.realpath(run_dir)
    if key in _held:  # this process trains it again (a second run in one notebook kernel)
        return
    path = os.path.join(run_dir, LOCK)
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise _unwritable(run_dir, error) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise ValueError(
            f"{run_dir} is being trained by another process ({holder}): wait for it to end or "
            "stop it, or give another --root_dir"
        ) from None
    except OSError:  # a filesystem without locks (some network mounts): train unguarded
        os.close(descriptor)
        return
    command = " ".join(os.path.basename(arg) if i == 0 else arg for i, arg in enumerate(sys.argv))
    holder = f"pid {os.getpid()}: {command[:150]}"
    if launcher_pid is not None:
        holder = f"pid {launcher_pid}: {command[:150]}; its learner pid {os.getpid()}"
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{holder}\n".encode(), 0)
    except OSError as error:  # a full disk: let go, so that the directory made can be removed
        os.close(descriptor)
        raise _unwritable(run_dir, error) from None
    _held[key] = descriptor


def _unwritable(run_dir: str, error: OSError) -> ValueError:
    """The one-line error for a run directory that cannot be written (`error` says why)."""
    then = (
        "free some space, or give a --root_dir on another disk"
        if error.errno == errno.ENOSPC
        else "give a --root_dir this user can write to, or make it writable"
    )
    return ValueError(f"cannot write to the run directory {run_dir} ({error.strerror}): {then}")


def release_lock(run_dir: str) -> None:
    """Lets go of the run directory's lock, if this process holds it."""
    descriptor = _held.pop(os.path.realpath(run_dir), None)
    if descriptor is not None:
        os.close(descriptor)


def remove_if_unused(root_dir: str) -> bool:
    """Removes `root_dir` (which this command created) when nothing was trained into it: no
    checkpoint and no row of metrics in it or below it (a run whose settings were rejected once
    it had made its directory). A directory that another live process holds the lock of, or one
    below it (the chief of a multi-worker run whose worker failed, an asynchronous learner still
    stopping), is left alone. Returns whether it removed it."""
    import shutil

    try:
        take_lock(root_dir)
    except ValueError:  # held by another process, or gone already
        return False
    try:
        for folder, _, files in os.walk(root_dir):
            if "checkpoint" in files or (LOCK in files and not _lockable(folder)):
                return False
            if "metrics.csv" in files:
                with open(os.path.join(folder, "metrics.csv")) as handle:
                    if len(handle.read().splitlines()) > 1:
                        return False
        shutil.rmtree(root_dir, ignore_errors=True)
        return True
    finally:
        root = os.path.realpath(root_dir)
        for key in [key for key in _held if key == root or key.startswith(root + os.sep)]:
            release_lock(key)


def _lockable(run_dir: str) -> bool:
    """Whether this process holds, or could take, `run_dir`'s lock: no other process trains it."""
    try:
        take_lock(run_dir)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def held(run_dir: str):
    """Lets go of the run directory's lock (`take_lock`) when the block ends: a notebook that
    trained a run leaves it free for a command in a terminal. The directories `open_run` created
    are removed again when the block fails before anything was trained into them (an env factory
    the workers cannot import, a batch that does not split, a rejected setting): no empty run is
    left to resume. The outermost of them goes only if no other process trains below it."""
    try:
        yield
    except BaseException:
        _let_go(run_dir, failed=True)
        raise
    _let_go(run_dir, failed=False)


def _let_go(run_dir: str, failed: bool) -> None:
    """Releases `run_dir`'s lock; when its run `failed`, first removes the directories
    `open_run` created for it if nothing was trained into them (the outermost only if no
    other process trains below it)."""
    key = os.path.realpath(run_dir)
    try:
        if failed and (top := _created.get(key)) is not None:
            remove_if_unused(run_dir)
            if os.path.realpath(top) != key:
                remove_if_unused(top)
    finally:  # even if the removal fails (a second Ctrl-C)
        _created.pop(key, None)
        release_lock(run_dir)


def atari_of(env, eval_episodes: int, log):
    """`env` if it is an `AtariConfig` (the policy's preprocessing, and what evaluation plays),
    else None; then a warning when `RunConfig.eval_episodes` asks for evaluations, which play
    Atari games only."""
    if isinstance(env, AtariConfig):
        return env
    if eval_episodes and log:
        log.message(
            f"warning: RunConfig.eval_episodes = {eval_episodes} is ignored: evaluation plays "
            "Atari games only (the metrics' episode_return_raw_mean is this env's score)"
        )
    return None


def publish_policy(
    network, atari, root_dir: str, logs, frames: int, frame_skip: int, wall_s: float,
    eval_episodes: int, eval_epsilon: float, seed: int, **head,
) -> None:  # fmt: skip
    """Exports the policy to `root_dir/policy` and, for Atari with `eval_episodes`, plays that
    many full games with it and writes a row of eval.csv (`head`: see `export.export_policy`)."""
    log, eval_log = logs
    policy_dir = os.path.join(root_dir, "policy")
    try:
        export.export_policy(network, atari, policy_dir, extra={"env_frames": frames}, **head)
    except export.WriteError as error:  # the checkpoint before it is saved: it can go on later
        raise ValueError(
            f"{error}; the checkpoint at {frames:,} frames is saved: make room, then run the "
            "same command to resume"
        ) from error
    if not (eval_episodes and atari):
        return
    scores = evaluate.evaluate(policy_dir, eval_episodes, epsilon=eval_epsilon, seed=seed)
    eval_log.write({
        "env_frames": frames, "agent_steps": frames // frame_skip, "wall_s": wall_s,
        "eval_return_mean": scores["mean"], "eval_return_std": scores["std"],
        "eval_at_step_limit": scores["at_step_limit"],  # games cut, not ended: a stuck policy
    })  # fmt: skip
    log.message(f"evaluation at {frames:,} frames: {scores['mean']:.1f}")


class _TextDelegate(config_parser.ParserDelegate):
    """Keeps references (`@name`, `@name()`) and macros (`%name`) of a gin file as text, so a
    file can be read without the configurables it names being registered."""

    def configurable_reference(self, scoped_name, evaluate):
        return f"@{scoped_name}()" if evaluate else f"@{scoped_name}"

    def macro(self, name):
        return f"%{name}"


def gin_settings(text: str) -> dict[str, object]:
    """The bindings of a gin file (e.g. an `operative_config.gin`) as `{"scope/name.arg": value}`,
    under their current names: a binding renamed since the file was written
    (`gin_configs.RENAMED`, e.g. `train.total_frames`) counts as the one it became."""
    settings = {}
    for statement in config_parser.ConfigParser(text, _TextDelegate()):
        if isinstance(statement, config_parser.BindingStatement):
            scope = f"{statement.scope}/" if statement.scope else ""
            name = (
                f"{statement.selector}.{statement.arg_name}"
                if statement.arg_name
                else f"%{statement.selector}"  # a macro, `SCALE = 0.5`
            )
            settings[f"{scope}{gin_configs.RENAMED.get(name, name)}"] = statement.value
    return settings


def changed_settings(before: str, after: str) -> list[str]:
    """What differs between two gin files, one `name: old -> new` per binding (`unset` where a
    file lacks it), sorted by name."""
    old, new = gin_settings(before), gin_settings(after)

    def shown(settings, name):
        return repr(settings[name]) if name in settings else "unset"

    return [
        f"{name}: {shown(old, name)} -> {shown(new, name)}"
        for name in sorted(old.keys() | new.keys())
        if name not in old or name not in new or old[name] != new[name]
    ]


# Heads the section of `operative_config.gin` that `run_settings` adds.
PENDING = "# Bound, not called before the run started"


def note_changed_settings(config_path: str, config: str, frames: int, log) -> None:
    """Warns when `config` differs from the run's `operative_config.gin` at `config_path`, and
    then keeps that file as `operative_config.<frames>.gin` (see `resume`)."""
    with open(config_path) as handle:
        previous = handle.read()
    kept, again = os.path.join(os.path.dirname(config_path), f"operative_config.{frames}.gin"), 1
    while os.path.exists(kept):  # resumed at these frames before: keep that file as well
        again += 1
        kept = os.path.join(os.path.dirname(config_path), f"operative_config.{frames}-{again}.gin")
    if PENDING not in previous:  # written before run_settings added the section: not a change
        config = config.split(f"\n{PENDING}")[0]
    try:
        changes = changed_settings(previous, config)
    except (SyntaxError, ValueError, tokenize.TokenError) as error:  # hand-edited or cut off
        os.replace(config_path, kept)
        log.message(f"warning: the run's previous settings ({kept}) are not readable gin: {error}")
        return
    if changes:
        os.replace(config_path, kept)
        log.message(
            f"warning: resumed with {len(changes)} setting(s) changed since the run last ran "
            f"(its settings then: {kept}): " + "; ".join(changes)
        )


# The settings that decide which variables a run's checkpoint holds: a run directory resumed
# with other values would fail to restore with a tensor-shape error deep in TensorFlow.
IDENTITY = (
    "run.trainer", "train.loss_fn", "train.torso", "train_off_policy.torso",
    "train_off_policy.dueling", "DQNConfig.num_atoms",
)  # fmt: skip


def check_same_algorithm(run_dir: str, config: str) -> None:
    """Raises a one-line ValueError when `run_dir` holds a run whose operative config differs
    from `config` in what decides its variables (`IDENTITY`: another algorithm or network)."""
    path = os.path.join(run_dir, "operative_config.gin")
    if not os.path.exists(path):
        return
    try:
        with open(path) as handle:
            before = gin_settings(handle.read())
    except (SyntaxError, ValueError, tokenize.TokenError):
        return  # unreadable: the restore and the settings warning say what they can
    after = gin_settings(config)

    def described(settings):
        return ", ".join(f"{name} = {settings[name]}" for name in IDENTITY if name in settings)

    # Only what the file holds: one cut short or emptied (a crash, a full disk) names no
    # algorithm, which is not another one.
    if any(str(before[name]) != str(after.get(name)) for name in IDENTITY if name in before):
        raise ValueError(
            f"{run_dir} holds a run of another algorithm or network ({described(before)}) than "
            f"this command's ({described(after)}): give a new --root_dir, or resume it with the "
            f"configs it was started with (its settings: {path})"
        )


def unrestorable(run_dir: str, config: str, error: ValueError) -> str:
    """Why no checkpoint of `run_dir` could be restored: when the settings changed since the run
    last ran, the changes (a game with another action set, a constant rate where there was a
    schedule: they change the variables); otherwise the restore's own error (damaged files)."""
    path = os.path.join(run_dir, "operative_config.gin")
    try:
        with open(path) as handle:
            changes = changed_settings(handle.read(), config)
    except (OSError, SyntaxError, ValueError, tokenize.TokenError):
        changes = []
    if not changes:
        return str(error)
    return (
        f"the checkpoints of {run_dir} do not fit this command's variables, whose settings "
        f"differ from the run's in {len(changes)} place(s): {'; '.join(changes)}: resume with "
        f"the run's settings ({path}) or give a new --root_dir"
    )


def checkpoints(run_dir: str, logs, frame_skip: int, team, **trackables):
    """The run's counters and `Checkpointer` (of `trackables` and the counters, in
    `run_dir/checkpoints`), resumed from its latest checkpoint if it has one (`resume`).

    Returns:
        `(counters, saver, restored)`: `restored` is the checkpoint's path, or None.
    """
    counters = checkpoint.Counters()
    saver = checkpoint.Checkpointer(
        os.path.join(run_dir, "checkpoints"), counters=counters, **trackables
    )
    return counters, saver, resume(saver, run_dir, logs, counters, frame_skip, team)


TRAINERS = ("train", "train_off_policy", "train_async")


def _blocks(text: str) -> dict[str, str]:
    """A gin config as gin prints it, by configurable: `{"scope/name": its block of text}`, and
    its macros' block (`# Macros:`, first where there is one) under `%`."""
    found = {}
    for block in re.split(r"^(?=# Parameters for )", text, flags=re.M):
        if match := re.match(r"# Parameters for (\S+):", block):
            found[match.group(1)] = block
        elif block.startswith("# Macros:"):
            found["%"] = block
    return found


def run_settings(team_config: str = "") -> str:
    """What a run's `operative_config.gin` holds: gin's operative config (the settings of every
    configurable called so far, defaults included), `team_config` (the launcher's, for an
    asynchronous learner), then the bindings of the configurables not called yet (with the
    macros, where they use one). Those are the ones called inside the first update, such as a
    configurable loss's own settings, which a file written before it would lack: a resume with
    other values would go unnoticed."""
    operative = gin.operative_config_str() + team_config
    called, bound = _blocks(operative), _blocks(gin.config_str())
    pending = [
        block
        for name, block in bound.items()
        # The trainers run before this: one not called is the other family's (`smoke.gin`
        # binds both).
        if name not in called and name != "%" and name.rsplit("/", 1)[-1] not in TRAINERS
    ]
    if not pending:
        return operative
    if "%" in bound and any("%" in block for block in pending):
        pending.insert(0, bound["%"])
    return (
        f"{operative}\n{PENDING} (a configurable loss's settings, called in its first "
        f"update):\n\n{''.join(pending)}"
    )


def resume(saver, run_dir: str, logs, counters, frame_skip: int, team) -> str | None:
    """Restores the latest checkpoint (if any; returns its path), writes the run's
    `operative_config.gin`, and rewinds metrics.csv and eval.csv to the restored frames, so the
    rows of work lost since that checkpoint are logged once, by the resumed run.

    A run resumed with other settings than it last ran with (a longer `total_frames`, another
    rate, or a network option that adds no variable, which the checkpoint cannot tell) goes on
    with the new ones, after a warning naming each change; the previous operative config is
    kept as `operative_config.<frames>.gin`."""
    config = run_settings(getattr(team, "operative_config", ""))
    check_same_algorithm(run_dir, config)
    tick = time.perf_counter()
    try:
        restored = saver.restore()
    except ValueError as error:
        raise ValueError(unrestorable(run_dir, config, error)) from None
    restore_seconds = time.perf_counter() - tick
    frames = int(counters.agent_steps) * frame_skip
    config_path = os.path.join(run_dir, "operative_config.gin")
    if restored and os.path.exists(config_path):
        note_changed_settings(config_path, config, frames, logs[0])
    with open(config_path, "w") as handle:
        handle.write(config)
    for log in logs:
        log.rewind(frames)
    if restored and frames and not logs[0].rows():  # emptied, removed, or never written
        logs[0].message(
            f"warning: {logs[0].path} has no rows at or before the checkpoint's {frames:,} "
            "frames: the curve starts there"
        )
    for path, reason in saver.skipped:
        logs[0].message(f"warning: skipped the unreadable checkpoint {path} ({reason})")
    if restored:
        logs[0].message(
            f"resumed from {restored} at {frames:,} frames (restored in {restore_seconds:.2f} s)"
        )
    return restored
