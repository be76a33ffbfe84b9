"""`bin/train` and `tfaccel-train`: trains an agent from gin configs; the same command on the
same --root_dir resumes.

    tfaccel-train --gin_file=a2c.gin --root_dir=runs/a2c_pong
    tfaccel-train --gin_file=a2c.gin --gin_file=smoke.gin --root_dir=/tmp/smoke
    tfaccel-train --gin_file=a2c.gin --gin_bindings='AtariConfig.game = "breakout"' --root_dir=...

A bare --gin_file name is looked up in tfaccel's gin configs (`gin_configs/`).
"""

import os
import sys

from absl import app, flags, logging

flags.DEFINE_string("root_dir", None, "The run directory (created, or resumed if it exists).")
flags.DEFINE_multi_string(
    "gin_file", [], "Gin config files; bare names are looked up in gin_configs/."
)
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, e.g. 'train.total_frames = 1000'.")
flags.mark_flag_as_required("root_dir")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from tfaccel import console, gin_configs

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with console.stderr_silenced():  # TensorFlow's and Keras's start-up lines
        from tfaccel import off_policy, runner  # noqa: F401  (registers the trainers with gin)
        from tfaccel.distribute import asynchronous
        from tfaccel.envs.pool import PoolError

    try:
        gin_configs.parse(FLAGS.gin_file, FLAGS.gin_bindings)
    except ImportError as error:  # a gin `import` line naming a module off the path
        first = str(error).strip().splitlines()[0]
        sys.exit(
            f"error: bad gin config: {first}: put its directory on PYTHONPATH "
            "(e.g. PYTHONPATH=. bin/train ...)"
        )
    except (ValueError, KeyError, NameError, SyntaxError, OSError) as error:
        first = str(error).strip().splitlines()[0]
        sys.exit(f"error: bad gin config: {first}")
    import tensorflow as tf

    peer_lost = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)
    peer_lost += (tf.errors.CancelledError, tf.errors.AbortedError)
    try:
        summary = runner.run(FLAGS.root_dir)
    except (ValueError, OSError, asynchronous.LearnerFailed) as error:
        # Bad settings, an unusable --root_dir, a failed learner: one line (gin appends where
        # the error was raised).
        sys.exit(f"error: {str(error).strip().splitlines()[0]}")
    except PoolError as error:  # env workers kept failing; the run saved a checkpoint first
        sys.exit(
            f"error: {str(error).strip().splitlines()[0]}; checkpoint saved: fix the env, then "
            "run the same command to resume"
        )
    except RuntimeError as error:  # gin: no algorithm config gave `train` its env and loss
        if not str(error).startswith("Required bindings"):
            raise
        algorithms = [name for name in gin_configs.names() if "/" not in name]
        sys.exit(
            f"error: {str(error).strip().splitlines()[0]}: start the --gin_file list with an "
            f"algorithm's config, e.g. --gin_file=categorical_dqn.gin; configs: "
            f"{', '.join(algorithms)}"
        )
    except peer_lost as error:  # multi-worker: a peer died or stopped answering
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        telling = [line for line in lines if "abort" in line or "connect" in line.lower()]
        cause = (telling or lines or [""])[0][:160]
        sys.exit(
            "error: a worker of the multi-worker run stopped answering, so this one stops too "
            f"({type(error).__name__}: {cause}); restart every worker with the same command to "
            "resume from the last checkpoint"
        )
    print_summary(summary, FLAGS.root_dir)


def print_summary(summary: dict, root_dir: str) -> None:
    """What the run reached and where its artifacts are (the whole run, across resumes)."""
    import csv
    import math

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
    print(
        f"done: {frames:,} frames ({steps:,} agent steps) in {wall / 60:.1f} min of training, "
        f"{steps / max(wall, 1e-9):,.0f} agent steps/s"
    )
    if scored:
        best, at = max(scored)
        print(
            f"score (mean of the last 20 full games): final {scored[-1][0]:.1f}, "
            f"best {best:.1f} at {at:,} frames"
        )
    else:
        print("score: no game finished yet")
    print(
        f"run directory {root_dir}: checkpoints/ (the same command resumes), policy/ "
        f"(bin/eval --policy_dir={os.path.join(root_dir, 'policy')}), metrics.csv "
        f"(bin/plot --run_dir={root_dir}), tb/ (tensorboard --logdir {os.path.join(root_dir, 'tb')})"
    )


def run() -> None:
    """The `tfaccel-train` command (and `bin/train`)."""
    app.run(main)


if __name__ == "__main__":  # python -m tfaccel.train_command
    run()
