"""The Python API for notebooks and scripts: `tfaccel.train` runs what `tfaccel-train` runs and
returns a `Run`; `tfaccel.load_policy` loads an exported policy.

    import tfaccel

    run = tfaccel.train("a2c.gin", "runs/catch", ["AtariConfig.game = 'breakout'"],
                        total_frames=2_000_000)
    run.summary["final_score"], run.metrics[-1]["fps"]
    run.evaluate(episodes=3)          # the JSON of tfaccel-eval, as a dict
    run.plot("curves.png")

Gin is scoped to the call: each `train` starts from an empty configuration and leaves gin empty
again, so any number of runs, of any algorithms, can follow each other in one process.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Sequence

from tfaccel import policy_client


def load_policy(policy_dir: str):
    """An exported policy (`RUN_DIR/policy`): `policy(observation [B, H, W, C] uint8)` returns
    a dict of numpy outputs (`action`, and `logits`, `q_values` or `probabilities`).

    Raises:
        ValueError: the directory is missing or not a loadable tfaccel policy.
    """
    return policy_client.load_policy(policy_dir)[0]


class Run:
    """A run directory and what its training returned."""

    def __init__(self, root_dir: str, summary: dict):
        self.root_dir = root_dir
        self.summary = summary  # the trainer's summary (final score, frames, stopped_by, ...)
        self._policy = None

    def __repr__(self) -> str:
        return f"Run({self.root_dir!r}, {self.summary.get('env_frames', 0):,} frames)"

    @property
    def metrics(self) -> list[dict]:
        """The rows of metrics.csv, numbers as floats (empty cells as None)."""
        path = os.path.join(self.root_dir, "metrics.csv")
        if not os.path.exists(path):
            return []
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        return [{key: _number(value) for key, value in row.items()} for row in rows]

    @property
    def policy_dir(self) -> str:
        return os.path.join(self.root_dir, "policy")

    @property
    def policy(self):
        """The exported policy, loaded (see `load_policy`)."""
        if self._policy is None:
            self._policy = load_policy(self.policy_dir)
        return self._policy

    def evaluate(self, episodes: int = 10, epsilon: float = 0.001, **settings) -> dict:
        """Plays full games with the exported policy (`tfaccel.evaluate.evaluate`; `settings`:
        sample, seed, gif, mp4, max_agent_steps, ...) and returns their raw scores."""
        from tfaccel import evaluate

        return evaluate.evaluate(self.policy_dir, episodes, epsilon=epsilon, **settings)

    def plot(self, out: str | None = None, **settings) -> str:
        """Draws the score against frames and wall time to `out` (a PNG; default: `curves.png`
        in the run directory) and returns its path; warnings go to stderr, as `tfaccel-plot`'s."""
        from tfaccel import plot

        out = os.path.join(self.root_dir, "curves.png") if out is None else out
        plot.plot([self.root_dir], out, warn=_warn, **settings)
        return out


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def _number(text):
    if text in (None, ""):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def train(
    config: str | Sequence[str], root_dir: str, bindings: Sequence[str] = (), **overrides
) -> Run:
    """Trains as `tfaccel-train --gin_file=... --gin_bindings=... --root_dir=...` does (the same
    `root_dir` resumes) and returns the `Run`.

    Args:
        config: a gin config or a list of them (bare names are tfaccel's, e.g. `"a2c.gin"`).
        root_dir: the run directory.
        bindings: gin bindings, e.g. `["AtariConfig.game = 'breakout'"]` (one may be given as
            a string).
        **overrides: settings bound after the configs and bindings, by their bare names:
            those of `RunConfig` (`total_frames=2_000`, `seed=1`, ...), of `PoolConfig`
            (`num_workers=0`, `envs_per_worker=4`, ...), of the config's trainer (`train` or
            `train_off_policy`, e.g. `learning_rate=1e-3`), or else of its env's config
            (`AtariConfig`: `game="breakout"`, `sticky_action_prob=0.25`, ...).

    Raises:
        ValueError: an unknown config, binding or parameter, or bad settings (with what is
            valid).
        KeyboardInterrupt: a Ctrl-C (SIGINT) stopped the run; it saved a checkpoint first.
        SystemExit: a SIGTERM stopped the run (status 143, as `tfaccel-train`'s); it saved too.
    """
    import gin

    from tfaccel import commands

    with commands.tensorflow_imported_quietly():  # no C++ start-up lines in a notebook
        from tfaccel import gin_configs, trainers

    files = _strings(config, "config", "a gin config name or path, or a list of them")
    bindings = _strings(bindings, "bindings", "gin bindings: a string or a list of strings")
    if not isinstance(root_dir, (str, os.PathLike)) or not str(root_dir).strip():
        raise ValueError(f"root_dir must be the directory the run goes to, got {root_dir!r}")
    root_dir = os.fspath(root_dir)
    try:
        with gin.unlock_config():  # a parse locks gin; the next call unlocks it here
            gin.clear_config()
            try:
                gin_configs.parse(files, bindings)
                if overrides:
                    extra = _override_bindings(overrides, _trainer_name())
                    gin.clear_config()
                    gin_configs.parse(files, [*bindings, *extra])
            except (KeyError, NameError, SyntaxError) as error:  # gin's, for a malformed line
                raise ValueError(f"bad gin config: {commands.first_line(error)}") from error
        for warning in trainers.idle_binding_warnings(bindings):
            _warn(warning)
        summary = trainers.run(root_dir)
    except RuntimeError as error:  # gin: no algorithm config gave the trainer its env and loss
        raise (gin_configs.no_algorithm(error, "config list") or error) from None
    finally:
        with gin.unlock_config():
            gin.clear_config()
    _raise_if_stopped(summary.get("stopped_by"), root_dir)
    return Run(root_dir, summary)


def _strings(value, name: str, wanted: str) -> list[str]:
    """`value` (one string or path, or a sequence of them) as a list of strings; a ValueError
    naming `name` and what it takes otherwise."""
    items = [value] if isinstance(value, (str, os.PathLike)) else value
    try:
        items = list(items)
    except TypeError:
        items = [None]
    if not all(isinstance(item, (str, os.PathLike)) for item in items):
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return [os.fspath(item) for item in items]


def _raise_if_stopped(signal_name: str | None, root_dir: str) -> None:
    """After a stop signal the run has saved; the caller stops too, as a Ctrl-C stops any other
    Python code and as `tfaccel-train` exits 130 or 143 (a script of several runs would go on to
    the next one)."""
    from tfaccel.commands.train import STOPPED_STATUS

    if signal_name == "SIGINT":
        raise KeyboardInterrupt(f"stopped by SIGINT; {root_dir} is saved: the same call resumes")
    if signal_name == "SIGTERM":
        raise SystemExit(STOPPED_STATUS["SIGTERM"])


def _override_bindings(overrides: dict, trainer: str) -> list[str]:
    """`train`'s overrides as gin bindings: a setting every trainer shares goes to the
    configurable that holds it (`RunConfig`, `PoolConfig`), a setting of `trainer` to it, any
    other to the config class of the env it trains on (`AtariConfig.game`).

    Raises:
        ValueError: a name that none of them takes (with the closest ones and the list).
    """
    import dataclasses
    import difflib
    import inspect

    import gin

    from tfaccel import runner

    owners = {
        field.name: shared.__name__
        for shared in (runner.RunConfig, runner.PoolConfig)
        for field in dataclasses.fields(shared)
    }
    not_settings = {"root_dir", "run_config", "pool_config", "team"}  # passed, not bound
    signature = inspect.signature(inspect.unwrap(gin.get_configurable(trainer)))
    owners |= {name: trainer for name in signature.parameters if name not in not_settings}
    try:  # the env the config trains on, e.g. @AtariConfig()
        env = gin.query_parameter(f"{trainer}.env").configurable
    except (ValueError, AttributeError):  # not bound, or not a configurable's reference
        env = None
    if env is not None and dataclasses.is_dataclass(env.wrapped):
        owners |= {
            field.name: env.name
            for field in dataclasses.fields(env.wrapped)
            if field.name not in owners
        }
    for name in overrides:
        if name not in owners:
            close = difflib.get_close_matches(name, owners, n=3)
            guess = f"did you mean {' or '.join(close)}? " if close else ""
            raise ValueError(
                f"{trainer} takes no setting {name!r}; {guess}its settings: {', '.join(owners)}"
            )
    return [f"{owners[name]}.{name} = {value!r}" for name, value in overrides.items()]


def _trainer_name() -> str:
    """`train_off_policy` when the parsed configs say `run.trainer = @train_off_policy`."""
    from tfaccel import trainers

    return trainers.trainers_run()[-1]  # train_async's learners take train's settings
