"""Trains an agent from gin configs; the same command on the same --root_dir resumes.

    tfaccel-train --gin_file=categorical_dqn.gin --root_dir=runs/c51_pong
    tfaccel-train --gin_file=a2c.gin --gin_file=smoke.gin --root_dir=/tmp/smoke
    tfaccel-train --gin_file=a2c.gin --gin_bindings="AtariConfig.game = 'breakout'" --root_dir=...

A bare --gin_file name is looked up in tfaccel's configs (gin_configs/: the presets, reference/,
toy/, testing/). Exit status: 0 when the run finished (or was already done), 1 with one line for
a user error, 130 after Ctrl-C and 143 after SIGTERM (a checkpoint was saved: the same command
resumes), so that `tfaccel-train ... && tfaccel-eval ...` stops at an interrupted run.
"""

import glob
import os
import re
import sys

from tfaccel import commands

STOPPED_STATUS = {
    "SIGINT": commands.INTERRUPTED_STATUS,
    "SIGTERM": commands.TERMINATED_STATUS,
}  # 128 + the signal's number, as shells report


def parse_flags(argv=None):
    parser = commands.parser(__doc__)
    parser.add_argument(
        "--root_dir", required=True, help="the run directory (created, or resumed if it exists)"
    )
    parser.add_argument(
        "--gin_file",
        action="append",
        default=[],
        help="a gin config, repeatable; a bare name is one of tfaccel's configs",
    )
    parser.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="a gin binding, repeatable, e.g. 'RunConfig.total_frames = 1000'",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Runs the command; its exit status."""
    flags = parse_flags(argv)
    if not flags.root_dir.strip():
        commands.fail("--root_dir is empty: give the directory the run goes to")
    with commands.tensorflow_imported_quietly():
        from tfaccel import gin_configs, trainers
        from tfaccel.envs.pool import PoolError
        from tfaccel.launcher import LearnerFailed

    try:
        gin_configs.parse(flags.gin_file, flags.gin_bindings)
    except ImportError as error:  # a gin `import` line naming a module off the path
        commands.fail(
            f"bad gin config: {commands.first_line(error)}: put its directory on PYTHONPATH "
            "(e.g. PYTHONPATH=. bin/train ...)"
        )
    except (ValueError, KeyError, NameError, SyntaxError, OSError) as error:
        commands.fail(f"bad gin config: {commands.first_line(error)}")
    for warning in trainers.idle_binding_warnings(flags.gin_bindings):
        print(warning, file=sys.stderr)
    import tensorflow as tf

    peer_lost = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)
    peer_lost += (tf.errors.CancelledError, tf.errors.AbortedError)
    try:
        summary = trainers.run(flags.root_dir)
    except (ValueError, OSError, LearnerFailed) as error:
        # Bad settings, an unusable --root_dir, a failed learner: one line (gin appends where
        # the error was raised).
        commands.fail(commands.first_line(error))
    except PoolError as error:  # env workers kept failing; the run saved a checkpoint first
        then = (
            "checkpoint saved: fix the env, then run the same command to resume"
            if _has_checkpoint(flags.root_dir)
            else "nothing was trained: fix the env, then run the command again"
        )
        commands.fail(f"{commands.first_line(error)}; {then}")
    except RuntimeError as error:  # gin: no algorithm config gave `train` its env and loss
        commands.fail(str(gin_configs.no_algorithm(error) or commands.first_line(error)))
    except tf.errors.InternalError as error:  # multi-worker: workers given other clusters
        sizes = re.search(
            r"joining a group with size ?(\d+), but that group has size (\d+)", str(error)
        )
        if sizes is None:
            raise
        fewer, more = sorted(int(size) for size in sizes.groups())  # replicas: devices x workers
        commands.fail(
            f"the workers disagree on the run's replicas ({fewer} and {more}): give every worker "
            "the same cluster.worker list in TF_CONFIG (with its own task.index) and the same "
            "number of devices"
        )
    except peer_lost as error:  # multi-worker: a peer died or stopped answering
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        telling = [line for line in lines if "abort" in line or "connect" in line.lower()]
        cause = (telling or lines or [""])[0][:160]
        then = (
            "restart every worker with the same command to resume from the last checkpoint"
            if _has_checkpoint(flags.root_dir)
            else "no checkpoint was saved yet: restart every worker with the same command"
        )
        commands.fail(
            "a worker of the multi-worker run stopped answering, so this one stops too "
            f"({type(error).__name__}: {cause}); {then}"
        )
    print_summary(summary, flags.root_dir)
    return STOPPED_STATUS.get(summary.get("stopped_by"), 0)


def _has_checkpoint(root_dir: str) -> bool:
    """Whether the run in `root_dir` saved a checkpoint: its own, or one in the directories
    below it where a worker, a machine or a learner that is not the first keeps its state
    (`worker-<i>`, `machine-<m>`, `learner-<i>`)."""
    root = glob.escape(root_dir)
    return any(
        glob.glob(os.path.join(root, *["*"] * depth, "checkpoints", "checkpoint"))
        for depth in range(3)
    )


def print_summary(summary: dict, root_dir: str) -> None:
    """What the run reached and where its artifacts are (the whole run, across resumes)."""
    import csv
    import math

    if not os.path.isdir(root_dir):  # stopped before it trained: nothing was kept
        return

    rows = []
    metrics = os.path.join(root_dir, "metrics.csv")
    if os.path.exists(metrics):
        with open(metrics, newline="") as handle:
            rows = list(csv.DictReader(handle))
    scored = [
        (float(row["episode_return_raw_mean"]), int(row["env_frames"]))
        for row in rows
        if row.get("episode_return_raw_mean") not in (None, "", "nan")
        and not math.isnan(float(row["episode_return_raw_mean"]))
    ]
    last = rows[-1] if rows else {"env_frames": 0, "agent_steps": 0, "wall_s": 0.0}
    # A run stopped before it trained has no summary of its own: the log's last row is its state.
    frames = summary.get("env_frames", int(last["env_frames"]))
    wall = summary.get("wall_s", float(last["wall_s"]))
    steps = int(last["agent_steps"])
    # The speed of the training loop, as metrics.csv has it: the summary's time also counts
    # the final checkpoint, export and evaluation games.
    rate = steps / max(float(last["wall_s"]), 1e-9)
    print(
        f"{'so far' if summary.get('stopped_by') else 'done'}: {frames:,} frames ({steps:,} "
        f"agent steps) in {wall / 60:.1f} min of training, {rate:,.0f} agent steps/s"
    )
    if scored:
        best, at = max(scored)
        print(
            f"score (mean of the last 20 full games): final {scored[-1][0]:.1f}, "
            f"best {best:.1f} at {at:,} frames"
        )
    else:
        print("score: no game finished yet")
    policy = os.path.join(root_dir, "policy")
    play = f"{commands.sibling('eval')} --policy_dir={policy} --episodes=10"
    if not _plays_atari(policy):  # an env of the user's own: tfaccel-eval plays Atari only
        play = f"tfaccel.load_policy({policy!r}) (the env is not Atari: eval cannot play it)"
    print(
        f"run directory {root_dir}:\n"
        f"  checkpoints/  the same command resumes\n"
        f"  policy/       {play}\n"
        f"  metrics.csv   {commands.sibling('plot')} --run_dir={root_dir} --out=curves.png\n"
        f"  tb/           tensorboard --logdir {os.path.join(root_dir, 'tb')}"
    )


def _plays_atari(policy_dir: str) -> bool:
    """Whether the exported policy describes its Atari preprocessing (so tfaccel-eval plays it);
    True when that cannot be read (the hint then names the command, which says what is wrong)."""
    import json

    try:
        with open(os.path.join(policy_dir, "tfaccel_policy.json")) as handle:
            return json.load(handle).get("preprocessing") is not None
    except (OSError, ValueError):
        return True


def run() -> None:
    """The `tfaccel-train` console script (and `bin/train`)."""
    from tfaccel.guards import StopRequest

    commands.raise_on_sigterm()  # as Ctrl-C does: what the run made while starting is removed
    try:
        status = main()
    except KeyboardInterrupt as stop:  # a signal before the training loop took it over, or after
        commands.interrupted(
            "while the run closed: its checkpoint is saved"
            if StopRequest.entered
            else "while starting: nothing was trained",
            stop,
        )
    sys.exit(status)


if __name__ == "__main__":  # python -m tfaccel.commands.train
    run()
