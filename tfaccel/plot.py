"""Learning curves of runs: raw score against frames and against wall time (behind `bin/plot`).

Runs whose `operative_config.gin` differ only in their seeds are one curve: the mean over seeds
with the range (min to max) shaded, on a common grid of frames (or seconds) that every run
covers. Other runs are one curve each, labelled by their directory name.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import re

import numpy as np

_SEED_LINE = re.compile(r"^[\w.]*seed\s*=.*$", re.MULTILINE)


@dataclasses.dataclass
class Run:
    """One run directory's curve."""

    name: str
    frames: np.ndarray  # [K] env frames of the metrics rows that have a score
    wall_s: np.ndarray  # [K]
    score: np.ndarray  # [K] mean raw score of the last 20 games
    config_key: str  # operative config without seeds (runs alike up to the seed share it)
    seed_key: str = ""  # its seed lines (runs with the same one are repeats, not seeds)


class NoFinishedGame(ValueError):
    """A run directory whose metrics.csv has no scored row yet: no game has ended in it (every
    smoke run's case).

    Attributes:
        runs: (directory name, env frames trained) of each such run.
    """

    def __init__(self, message: str, runs: list[tuple[str, int]]):
        super().__init__(message)
        self.runs = runs


_COLUMNS = ("env_frames", "wall_s", "episode_return_raw_mean")  # what a curve reads


def load_run(run_dir: str, warn=print) -> Run:
    """Reads `metrics.csv` (and `operative_config.gin`) of a run directory. Rows that cannot be
    read (a hand edit, damaged bytes) are left out with a `warn(...)` line that counts them; a
    last row cut short (the run writing it, or a crash) is left out silently.

    Raises:
        ValueError: the directory has no metrics.csv, or one without the columns of a curve.
        NoFinishedGame: it has no scored row yet.
    """
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir} is not a run directory: it has no metrics.csv")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file: a run directory's metrics.csv is a table")
    with open(path, newline="", errors="replace") as handle:
        reader = csv.DictReader(handle)
        rows, columns = list(reader), reader.fieldnames or []
    missing = [column for column in _COLUMNS if column not in columns]
    if columns and missing:
        raise ValueError(
            f"{path} is not a tfaccel metrics table: it has no {', '.join(missing)} column "
            f"(its columns: {', '.join(columns[:6])}{', ...' * (len(columns) > 6)})"
        )
    if rows and None in rows[-1].values():  # cut short: the last cells are missing
        rows.pop()
    table, unreadable = [], 0
    for row in rows:
        try:  # a score is empty (or nan) until a game has ended
            if None in row or None in row.values():  # more or fewer cells than columns
                raise ValueError
            cells = [row[column] for column in _COLUMNS]
            cells[-1] = cells[-1] or "nan"
            table.append([float(cell) for cell in cells])
        except (TypeError, ValueError):
            unreadable += 1
    if unreadable:
        warn(f"warning: {path}: left out {unreadable} unreadable row(s) (a hand edit or damaged "
             "bytes)")  # fmt: skip
    table = np.array(table, np.float64).reshape(-1, len(_COLUMNS))  # [K, 3]
    scored = table[~np.isnan(table[:, 2])]
    name = os.path.basename(os.path.normpath(run_dir))
    if not len(scored):
        frames = int(table[-1, 0]) if len(table) else 0
        raise NoFinishedGame(f"{path} has no finished games yet", [(name, frames)])
    config_path = os.path.join(run_dir, "operative_config.gin")
    config = open(config_path).read() if os.path.exists(config_path) else run_dir
    return Run(
        name=name,
        frames=scored[:, 0],
        wall_s=scored[:, 1],
        score=scored[:, 2],
        config_key=_SEED_LINE.sub("", config).strip(),
        seed_key="\n".join(_SEED_LINE.findall(config)),
    )


@dataclasses.dataclass
class Curve:
    """What one line of the plot shows: a mean over `runs` and its range."""

    label: str
    runs: list[str]
    x: np.ndarray  # [G]
    mean: np.ndarray  # [G]
    low: np.ndarray  # [G]
    high: np.ndarray  # [G]


def curves(runs: list[Run], axis: str = "frames", points: int = 200) -> list[Curve]:
    """Groups runs alike up to their seeds and averages each group on a common grid.

    Args:
        runs: the loaded runs.
        axis: `frames` or `wall_s`.
        points: grid points of a group of several runs (a single run keeps its own rows).
    """
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.config_key, []).append(run)
    result = []
    for members in groups.values():
        names = [run.name for run in members]
        xs = [getattr(run, axis) for run in members]
        if len(members) == 1:
            x, scores = xs[0], members[0].score[None]
        else:
            end = min(x[-1] for x in xs)  # every run covers the grid
            start = max(x[0] for x in xs)
            x = np.linspace(start, end, points) if end > start else np.array([end])
            scores = np.stack(
                [np.interp(x, xr, run.score) for xr, run in zip(xs, members, strict=True)]
            )
        seeds = len({run.seed_key for run in members})
        count = f"{len(names)} seeds"
        if seeds < len(names):  # repeats of a seed
            count = f"{len(names)} runs, {seeds} seed{'s' * (seeds > 1)}"
        label = names[0] if len(names) == 1 else f"{_common_name(names)} ({count})"
        result.append(
            Curve(label, names, x, scores.mean(0), scores.min(0), scores.max(0))
        )  # fmt: skip
    return result


def _common_name(names: list[str]) -> str:
    """What the names of a run's seeds share, without the seed's marker: `pong_s0`, `pong_s1`
    -> `pong`; `pong_seed1`, `pong_seed2` -> `pong`."""
    prefix = re.sub(r"[_\-.]+(seed|s)?$", "", os.path.commonprefix(names)).rstrip("_-.")
    return prefix or names[0]


def load_runs(run_dirs: list[str], warn=print) -> list[Run]:
    """The runs of `run_dirs` that have a finished game; each other one is left out with a
    `warn(...)` line that says why, unless no run has a finished game (see Raises).

    Raises:
        NoFinishedGame: none has a finished game, and some are run directories: its message
            names them (`no finished game yet in NAME (N frames), ...`); the others were warned
            about.
        ValueError: none of them is a run directory, or one is given twice.
    """
    given = [os.path.realpath(run_dir) for run_dir in run_dirs]
    twice = [
        d
        for i, d in enumerate(run_dirs)
        if given.count(given[i]) > 1 and given.index(given[i]) == i
    ]
    if twice:  # averaged with itself, it would count as two seeds
        raise ValueError(f"run directory given twice: {', '.join(twice)}; give each once")
    runs, left_out = [], []
    for run_dir in run_dirs:
        try:
            runs.append(load_run(run_dir, warn))
        except ValueError as error:
            left_out.append(error)
    fresh = [error for error in left_out if isinstance(error, NoFinishedGame)]
    if not runs and not fresh:  # the error names each: no warnings before it
        raise ValueError(f"nothing to plot: {'; '.join(str(error) for error in left_out)}")
    for error in left_out:
        if runs or not isinstance(error, NoFinishedGame):
            warn(f"warning: left out: {error}")
    if not runs:
        counts = [count for error in fresh for count in error.runs]
        names = ", ".join(f"{name} ({frames:,} frames)" for name, frames in counts)
        raise NoFinishedGame(f"no finished game yet in {names}", counts)
    return runs


def plot(
    run_dirs: list[str],
    out: str,
    title: str | None = None,
    target: float | None = None,
    warn=print,
):
    """Writes to `out` a figure (PNG, or the format its extension names: `.svg`, `.pdf`) with
    score against frames (left) and against wall time (right) of the runs with a finished game (`load_runs`: the others are left out with a warning).

    When no run has a finished game yet (a smoke run's 2,000 frames of Pong), the figure has its
    axes and, in each panel, a note naming the runs; one `warn(...)` line says so.

    Returns:
        The curves of the frames panel (for tests and captions); none without a finished game.

    Raises:
        ValueError: `out` cannot be written (a directory, a missing directory), `target` is
            not a finite number, a run directory is given twice, or no run directory is given
            (a directory without metrics.csv), all before any drawing.
    """
    from tfaccel.evaluate import check_output_file

    check_output_file(out, "out")
    number = isinstance(target, (int, float, np.integer, np.floating)) and not isinstance(
        target, bool
    )
    if target is not None and not (number and math.isfinite(target)):
        raise ValueError(f"target must be a finite score (a number), got {target!r}")
    try:
        runs, empty = load_runs(run_dirs, warn), None
    except NoFinishedGame as error:
        runs, empty = [], str(error)
        warn(f"warning: {empty}: {out} shows empty axes; plot again once a game has ended")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_frames, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = ((by_frames, "frames", 1e6, "env frames (millions)"),)
    panels += ((by_time, "wall_s", 60.0, "wall time (minutes)"),)
    frame_curves = []
    for axes, axis, scale, xlabel in panels:
        for curve in curves(runs, axis):
            (line,) = axes.plot(curve.x / scale, curve.mean, label=curve.label)
            if len(curve.runs) > 1:
                axes.fill_between(
                    curve.x / scale, curve.low, curve.high, color=line.get_color(), alpha=0.2
                )
            if axis == "frames":
                frame_curves.append(curve)
        if target is not None:
            axes.axhline(target, color="gray", linestyle="--", linewidth=1, label="target")
        if empty is not None:
            axes.text(0.5, 0.5, empty, transform=axes.transAxes, ha="center", va="center",
                      wrap=True, color="gray")  # fmt: skip
        axes.set_xlabel(xlabel)
        axes.set_ylabel("raw score (mean of the last 20 games)")
        axes.grid(alpha=0.3)
    if frame_curves or target is not None:
        by_frames.legend(loc="lower right", fontsize="small")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    # Exactly at `out`: without an extension matplotlib would add one, and the commands that
    # report `out` would name a file that does not exist.
    figure.savefig(out, dpi=100, format=os.path.splitext(out)[1][1:].lower() or "png")
    plt.close(figure)
    return frame_curves
