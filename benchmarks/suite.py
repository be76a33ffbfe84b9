#!/usr/bin/env python3
"""The multi-game suite: one config per algorithm, on the games the Atari papers report first,
side by side with published results.

    .venv/bin/python benchmarks/suite.py run --root=runs/suite               # the whole grid
    .venv/bin/python benchmarks/suite.py run --root=runs/suite --only=a2c --hours=2.5
    .venv/bin/python benchmarks/suite.py run --root=runs/suite --seeds=0   # every first seed
    .venv/bin/python benchmarks/suite.py list --root=runs/suite              # what is done
    .venv/bin/python benchmarks/suite.py keep --root=runs/suite              # logs into the repo
    .venv/bin/python benchmarks/suite.py summary --root=benchmarks/results/suite/runs

`run` trains each config x game x seed of the grid (`GRID` below) in its own run directory,
`<root>/<entry>/<game>/seed<k>`, one after another (`--jobs` at once), and skips what is done. Every
run is an ordinary resumable run of `bin/train`, so the suite may be stopped at any moment (Ctrl-C,
SIGTERM, a lost machine) and the same command continues: an unfinished run resumes from its last
checkpoint (off-policy runs keep their replay in it). `--hours` gives every run the time left as
its wall limit, so that the last one saves and stops before the budget ends.

`keep` copies each run's logs (metrics.csv, eval.csv, operative_config.gin; not its checkpoints)
into benchmarks/results/suite/runs/, laid out like the run directories: a run directory lives on
the machine that trained it, the logs are committed, and `summary` reads either.

`summary` reads the run directories (or the kept logs) and the published references (benchmarks/reference/) and
writes benchmarks/results/suite/summary.json (one entry per config x game: the seeds, their
frames, the mean of the last 20 full games, wall time, agent steps/s, the reference with its
source and protocol, and a verdict: ahead, level or behind) and summary.png (a panel per game:
score against frames, the mean and range over seeds, the reference marked).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel import guards  # noqa: E402
from tfaccel.bench import results as results_file  # noqa: E402

REFERENCES = os.path.join(ROOT, "benchmarks", "reference")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "suite")
KEPT = os.path.join(RESULTS, "runs")  # the logs of the suite's runs, committed
KEPT_FILES = ("metrics.csv", "eval.csv", "operative_config.gin")
GAMES = ("pong", "breakout", "beam_rider", "qbert", "seaquest", "space_invaders")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row of the grid: a config trained on some games with some seeds.

    Attributes:
        name: the entry's name (its folder under the root).
        config: the gin file, as `bin/train --gin_file` takes it.
        trainer: the gin name of the config's trainer (`train` or `train_off_policy`), which the
            suite's bindings (frames, seed, wall limit) address.
        games: ale-py game ids.
        seeds: the seeds of each game.
        frames: env frames per run.
        sticky_action_prob: as the reference's protocol has it.
        reference: `<kind>:<agent>`, the published figure to compare with (`REFERENCE_KINDS`).
        bindings: further gin bindings (none in the presets' entries: one config for every game).
    """

    name: str
    config: str
    trainer: str
    games: tuple[str, ...]
    seeds: tuple[int, ...]
    frames: int
    sticky_action_prob: float
    reference: str
    bindings: tuple[str, ...] = ()


# The order runs are trained in: A2C first (cheap: about an hour per game), Pong and Breakout
# first among its games (the two that decided the presets' first layers), then C51, PPO and
# APPO, then the second seeds.
A2C_GAMES = ("pong", "breakout", "space_invaders", "seaquest", "qbert", "beam_rider")
GRID = (
    Entry("a2c", "a2c.gin", "train", A2C_GAMES, (0,), 40_000_000, 0.0, "schulman2017:A2C"),
    Entry(
        "c51",
        "categorical_dqn.gin",
        "train_off_policy",
        ("breakout", "qbert", "space_invaders"),
        (0,),
        10_000_000,
        0.25,
        "dopamine:C51",
    ),  # fmt: skip
    Entry(
        "ppo",
        "ppo.gin",
        "train",
        ("breakout", "space_invaders"),
        (0,),
        10_000_000,
        0.0,
        "baselines:PPO",
    ),  # fmt: skip
    Entry("appo", "appo.gin", "train", ("pong",), (0,), 20_000_000, 0.0, "baselines:PPO"),
    Entry(
        "appo",
        "appo.gin",
        "train",
        ("breakout", "space_invaders"),
        (0,),
        10_000_000,
        0.0,
        "baselines:PPO",
    ),  # fmt: skip
    Entry("a2c", "a2c.gin", "train", A2C_GAMES, (1,), 40_000_000, 0.0, "schulman2017:A2C"),
    Entry(
        "c51",
        "categorical_dqn.gin",
        "train_off_policy",
        ("pong",),
        (0, 1),
        10_000_000,
        0.25,
        "dopamine:C51",
    ),  # fmt: skip
    Entry("ppo", "ppo.gin", "train", ("pong",), (0, 1), 20_000_000, 0.0, "baselines:PPO"),
    Entry(
        "dqn", "dqn.gin", "train_off_policy", ("pong",), (0, 1), 10_000_000, 0.25, "dopamine:DQN"
    ),  # fmt: skip
    Entry(
        "rainbow",
        "rainbow.gin",
        "train_off_policy",
        ("pong",),
        (0, 1),
        10_000_000,
        0.25,
        "dopamine:Rainbow",
    ),  # fmt: skip
    Entry(
        "c51",
        "categorical_dqn.gin",
        "train_off_policy",
        ("breakout", "qbert", "space_invaders"),
        (1,),
        10_000_000,
        0.25,
        "dopamine:C51",
    ),  # fmt: skip
)


@dataclasses.dataclass(frozen=True)
class Job:
    entry: Entry
    game: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.entry.name}/{self.game}/seed{self.seed}"

    def run_dir(self, root: str) -> str:
        return os.path.join(root, self.entry.name, self.game, f"seed{self.seed}")


def jobs(
    only: set[str] | None = None, games: set[str] | None = None, seeds: set[int] | None = None
) -> list[Job]:
    """The grid's runs in the order they are trained: entry by entry as listed (every game of
    an entry's first seed before its second), each (entry, game, seed) once; `only`, `games`
    and `seeds` select (None: all)."""
    seen, result = set(), []
    for entry in GRID:
        if only and entry.name not in only:
            continue
        for seed in entry.seeds:
            if seeds is not None and seed not in seeds:
                continue
            for game in entry.games:
                job = Job(entry, game, seed)
                key = (entry.name, game, seed)
                if key not in seen and (not games or game in games):
                    seen.add(key)
                    result.append(job)
    return result


def trained_frames(run_dir: str) -> int:
    """The env frames of a run directory's last metrics row (0 without one)."""
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return 0
    with open(path) as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    try:
        return int(float(lines[-1].split(",")[0])) if len(lines) > 1 else 0
    except ValueError:  # a cut last row: the run itself will say what it is
        return 0


def progress(job: Job, root: str, kept: str | None = KEPT) -> int:
    """The frames a job has trained: those of its run directory under `root`, or of its kept
    logs under `kept` where they went further (a run finished on another machine, or before
    the run directories were cleared, is not trained again)."""
    frames = trained_frames(job.run_dir(root))
    return max(frames, trained_frames(job.run_dir(kept))) if kept else frames


def command(job: Job, root: str, wall_seconds: float | None) -> list[str]:
    """The `bin/train` command of one run."""
    entry, trainer = job.entry, job.entry.trainer
    bindings = [
        f"AtariConfig.game = '{job.game}'",
        f"AtariConfig.sticky_action_prob = {entry.sticky_action_prob}",
        f"RunConfig.total_frames = {entry.frames}",
        f"RunConfig.seed = {job.seed}",
    ]
    if trainer == "train_off_policy":
        bindings.append("train_off_policy.checkpoint_replay = True")  # resume keeps the replay
    if wall_seconds is not None:
        bindings.append(f"RunConfig.max_wall_seconds = {int(wall_seconds)}")
    bindings += entry.bindings
    return [
        sys.executable,
        os.path.join(ROOT, "bin", "train"),
        f"--gin_file={entry.config}",
        f"--root_dir={job.run_dir(root)}",
    ] + [f"--gin_bindings={binding}" for binding in bindings]


def run_grid(
    root: str, todo: list[Job], parallel: int, hours: float | None, kept: str | None = KEPT
) -> int:
    """Trains the unfinished jobs (`progress`: a job whose kept logs are finished is done),
    `parallel` at a time; 0 when all ended well, 130/143 after a signal (forwarded to the runs,
    which save first), 1 when a run failed (the others go on)."""
    deadline = time.monotonic() + hours * 3600 if hours else None
    pending = [job for job in todo if progress(job, root, kept) < job.entry.frames]
    print(f"suite: {len(todo) - len(pending)} of {len(todo)} runs done, {len(pending)} to train")
    running: dict[subprocess.Popen, Job] = {}
    stopped, failed = [], []

    def forward(signum, _frame):
        stopped.append(signum)
        for process in running:
            process.send_signal(signum)

    # Restored at the end: a caller that runs the grid in its own process (the tests) keeps
    # its own Ctrl-C.
    # A SIGINT ignored from the start (`suite.py run &` in a script) stays ignored, as the runs
    # inherit it: tfaccel-train's own rule.
    stops = [sig for sig in (signal.SIGTERM, signal.SIGINT) if not guards.inherited_ignore(sig)]
    previous = {sig: signal.signal(sig, forward) for sig in stops}
    try:
        while (pending or running) and not stopped:
            while pending and len(running) < parallel and not stopped:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left < 120:
                    pending.clear()  # no time for a start-up and one checkpoint
                    break
                job = pending.pop(0)
                os.makedirs(os.path.dirname(job.run_dir(root)), exist_ok=True)
                log = open(job.run_dir(root) + ".log", "a")
                print(f"suite: {job.label} from {trained_frames(job.run_dir(root)):,} frames")
                process = subprocess.Popen(
                    command(job, root, left), stdout=log, stderr=log, start_new_session=True
                )  # signals reach it through forward() alone, once
                running[process] = job
                log.close()
            time.sleep(1.0)
            for process in [p for p in running if p.poll() is not None]:
                job = running.pop(process)
                frames = trained_frames(job.run_dir(root))
                print(f"suite: {job.label} exit {process.returncode} at {frames:,} frames")
                if process.returncode not in (0, 130, 143):
                    failed.append(job.label)
        for process in running:
            process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        print(f"suite: failed: {', '.join(failed)} (see their .log beside the run directories)")
    if stopped:
        return 128 + stopped[0]
    return 1 if failed else 0


def keep(root: str, todo: list[Job], into: str = KEPT) -> tuple[list[str], list[str]]:
    """Copies the logs of each run that has any (`KEPT_FILES`, not its checkpoints) into
    `into/<entry>/<game>/seed<k>/`, which `summary --root` reads like the run directories
    themselves: a run directory lives on one machine, the suite's figures in the repository.
    Logs already kept that went further than the run directory's stay as they are.
    Returns the labels of the runs copied, and of those left alone for that reason."""
    import shutil

    copied, further = [], []
    for job in todo:
        source = job.run_dir(root)
        if not os.path.exists(os.path.join(source, "metrics.csv")):
            continue
        target = job.run_dir(into)
        if trained_frames(target) > trained_frames(source):
            further.append(job.label)
            continue
        os.makedirs(target, exist_ok=True)
        for name in KEPT_FILES:
            if os.path.exists(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
        copied.append(job.label)
    return copied, further


def camel(game: str) -> str:
    """`space_invaders` -> `SpaceInvaders`, as the papers' tables name games."""
    return "".join(part.capitalize() for part in game.split("_"))


def load_reference(kind_agent: str, game: str, frames: int) -> dict | None:
    """The published figure for `game` after `frames` (None where none is published): its
    source, protocol, mean, low and high over the published seeds (equal to the mean where only
    a mean is published), and, for curves, the curve itself."""
    kind, agent = kind_agent.split(":")
    if kind == "dopamine":
        path = os.path.join(REFERENCES, f"dopamine_{camel(game).lower()}.json")
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            document = json.load(handle)
        step = document["frames_per_iteration"]
        seeds = document["runs"].get(agent)
        if not seeds or min(len(seed) for seed in seeds) * step < frames:
            return None
        at = [seed[frames // step - 1] for seed in seeds]
        length = min(len(seed) for seed in seeds)
        curve = [[(i + 1) * step, *_spread([seed[i] for seed in seeds])] for i in range(length)]
        return {
            "source": document["source"],
            "protocol": f"{agent} as Dopamine runs it ({document['settings'].get(agent, '')}); "
            + document["what"],
            "seeds": len(seeds),
            **dict(zip(("mean", "low", "high"), _spread(at), strict=True)),
            "curve": curve,
        }
    if kind == "schulman2017":
        with open(os.path.join(REFERENCES, "schulman2017_table6.json")) as handle:
            document = json.load(handle)
        mean = document["scores"].get(camel(game), {}).get(agent)
        if mean is None:
            return None
        return {
            "source": document["source"],
            "protocol": document["protocol"],
            "seeds": 3,
            "frames": 40_000_000,
            "mean": mean,
            "low": mean,  # only the mean over 3 seeds is published
            "high": mean,
        }
    if kind == "baselines":  # ppo2's curve, read at `frames`
        import numpy as np

        with open(os.path.join(REFERENCES, "baselines_ppo2_atari10m.json")) as handle:
            document = json.load(handle)
        points = sorted(document["curves"].get(camel(game), []))
        if agent != "PPO" or not points or points[-1][0] < 0.99 * frames:
            return None
        frames_at, scores = zip(*points, strict=True)
        mean = round(float(np.interp(frames, frames_at, scores)), 2)
        return {
            "source": document["source"],
            "protocol": document["protocol"] + "; " + document["what"],
            "seeds": 6,
            "mean": mean,
            "low": mean,  # only the mean over 6 runs is published
            "high": mean,
            "curve": [[f, score, score, score] for f, score in points],
        }
    raise ValueError(f"unknown reference kind {kind!r}; valid: dopamine, schulman2017, baselines")


def _spread(values: list[float]) -> tuple[float, float, float]:
    return (float(sum(values) / len(values)), float(min(values)), float(max(values)))


def verdict(score: float, reference: dict) -> str:
    """ahead: above the reference's mean; level: within its range over seeds, or within 10% of
    its mean where only a mean is published; behind: otherwise."""
    mean, low, high = reference["mean"], reference["low"], reference["high"]
    if score > mean:
        return "ahead"
    if low < high:
        return "level" if score >= low else "behind"
    return "level" if score >= mean - 0.1 * abs(mean) else "behind"


def seed_summary(run_dir: str) -> dict | None:
    """A run directory's figures, or None when it has no scored row yet."""
    from tfaccel import plot

    try:
        run = plot.load_run(run_dir)
    except ValueError:
        return None
    frames = trained_frames(run_dir)
    wall = float(run.wall_s[-1])
    return {
        "run_dir": os.path.relpath(run_dir),
        "frames": frames,
        "score": float(run.score[-1]),  # the mean of the last 20 full games
        "best": float(max(run.score)),
        "wall_s": wall,
        "agent_steps_per_s": frames / 4 / wall if wall > 0 else None,
        "curve": [[int(f), round(float(s), 2)] for f, s in zip(run.frames, run.score, strict=True)],
    }


def summarize(root: str) -> list[dict]:
    """One entry per config x game, with its seeds' figures, its reference and its verdict."""
    entries = {}
    for job in jobs():
        key = (job.entry.name, job.game)
        entry = entries.setdefault(
            key,
            {
                "config": job.entry.config,
                "entry": job.entry.name,
                "game": job.game,
                "frames": job.entry.frames,
                "sticky_action_prob": job.entry.sticky_action_prob,
                "seeds": {},
                "reference": load_reference(job.entry.reference, job.game, job.entry.frames),
            },
        )
        figures = seed_summary(job.run_dir(root))
        if figures is not None:
            entry["seeds"][str(job.seed)] = figures
    for entry in entries.values():
        done = [s for s in entry["seeds"].values() if s["frames"] >= entry["frames"]]
        entry["finished_seeds"] = len(done)
        entry["score"] = _spread([s["score"] for s in done]) if done else None
        reference = entry["reference"]
        entry["verdict"] = (
            verdict(entry["score"][0], reference)
            if done and reference
            else "in progress"
            if entry["seeds"]
            else "not run"
        )
    return list(entries.values())


COLORS = {
    "a2c": "tab:blue",
    "c51": "tab:red",
    "ppo": "tab:green",
    "appo": "tab:purple",
    "dqn": "tab:brown",
    "rainbow": "tab:orange",
}


def seed_band(curves: list, points: int = 200) -> tuple:
    """The mean, low and high of seeds' curves ([(frames, score), ...] each) on `points` frames
    from the first to the last any seed reached; each point is over the seeds that reached it,
    so a seed still short of the others does not cut their curve.

    >>> grid, mean, low, high = seed_band([[(0, 0.0), (10, 10.0)], [(0, 2.0), (5, 2.0)]], 3)
    >>> grid.tolist(), mean.tolist(), low.tolist(), high.tolist()
    ([0.0, 5.0, 10.0], [1.0, 3.5, 10.0], [0.0, 2.0, 10.0], [2.0, 5.0, 10.0])
    """
    import numpy as np

    ends = np.array([curve[-1][0] for curve in curves], float)
    grid = np.linspace(min(curve[0][0] for curve in curves), ends.max(), points)
    ys = np.stack([np.interp(grid, *np.array(curve, float).T) for curve in curves])
    ys[grid[None, :] > ends[:, None]] = np.nan  # [seeds, points]
    return grid, np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def seeds_text(finished: int, drawn: int) -> str:
    """`1 seed`, `2 seeds`, `1 seed + 1 unfinished`: what a curve of `drawn` seeds holds."""
    text = f"{finished} seed{'' if finished == 1 else 's'}"
    return text if drawn == finished else f"{text} + {drawn - finished} unfinished"


def draw(entries: list[dict], path: str) -> None:
    """A panel per game: each entry's mean score over seeds against frames, its range shaded,
    and its reference (a curve, or a point with its range at the reference's frames)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, game in zip(axes.flat, GAMES, strict=True):
        shared = {}  # a reference -> the entries held to it (PPO and APPO share ppo2's curve)
        for entry in [e for e in entries if e["game"] == game]:
            color = COLORS.get(entry["entry"], "black")
            curves = [seed["curve"] for seed in entry["seeds"].values() if seed["curve"]]
            if curves:
                grid, mean, low, high = seed_band(curves)
                label = f"{entry['entry']} ({seeds_text(entry['finished_seeds'], len(curves))})"
                axis.plot(grid / 1e6, mean, color=color, label=label)
                axis.fill_between(grid / 1e6, low, high, color=color, alpha=0.2)
            if reference := entry["reference"]:  # one file may hold several agents' figures
                key = (reference["source"], reference["protocol"])  # one curve, or a point:
                key += () if "curve" in reference else (reference["mean"],)  # at its frames
                shared.setdefault(key, []).append(entry)
        for held in shared.values():
            _draw_reference(axis, held)
        axis.set_title(camel(game))
        axis.set_xlabel("env frames (M)")
        axis.set_ylabel("raw score, last 20 games")
        axis.grid(alpha=0.3)
        if axis.has_data():
            axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _draw_reference(axis, held: list[dict]) -> None:
    """One reference on a game's panel, in the colour of the first entry `held` to it and named
    after them all: a curve to the furthest of their frames, or a point with its range."""
    import numpy as np

    reference, names = held[0]["reference"], ", ".join(dict.fromkeys(e["entry"] for e in held))
    color = COLORS.get(held[0]["entry"], "black")
    if "curve" in reference:
        x, mean, low, high = np.array(reference["curve"]).T
        cut = x <= max(e["frames"] for e in held) * 1.0001
        axis.plot(x[cut] / 1e6, mean[cut], "--", color=color, label=f"{names} ref.")
        axis.fill_between(x[cut] / 1e6, low[cut], high[cut], color=color, alpha=0.08)
        return
    frames = reference.get("frames") or held[0]["frames"]  # a point: the same figure for all
    error = [[reference["mean"] - reference["low"]], [reference["high"] - reference["mean"]]]
    axis.errorbar(frames / 1e6, reference["mean"], yerr=error, fmt="*", color=color,
                  markersize=12, label=f"{names} ref.")  # fmt: skip


def table(entries: list[dict]) -> str:
    """The summary as a Markdown table (docs/results.md)."""
    lines = [
        "| config | game | frames | seeds | score (mean, range) | reference | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        score = (
            "—"
            if e["score"] is None
            else f"{e['score'][0]:.1f} ({e['score'][1]:.1f} to {e['score'][2]:.1f})"
        )
        ref = e["reference"]
        reference = "—"
        if ref is not None:
            reference = f"{ref['mean']:.1f} ({ref['low']:.1f} to {ref['high']:.1f})"
            if ref.get("frames", e["frames"]) != e["frames"]:
                reference += f" at {ref['frames'] / 1e6:.0f}M frames"
        lines.append(
            f"| {e['config']} | {camel(e['game'])} | {e['frames'] / 1e6:.0f}M | "
            f"{e['finished_seeds']}/{len(e['seeds']) or 0} | {score} | {reference} | {e['verdict']} |"
        )
    return "\n".join(lines)


def selected(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Job]:
    """The jobs that `--only`, `--games` and `--seeds` select; an unknown name or seed ends the
    command with one line naming the valid ones."""
    names = {entry.name for entry in GRID}
    only = {name for name in args.only.split(",") if name}
    games = {game for game in args.games.split(",") if game}
    if only - names:
        parser.error(f"unknown entries {sorted(only - names)}; valid: {', '.join(sorted(names))}")
    if games - set(GAMES):
        parser.error(f"unknown games {sorted(games - set(GAMES))}; valid: {', '.join(GAMES)}")
    try:
        seeds = {int(seed) for seed in args.seeds.split(",") if seed.strip()}
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give seed numbers separated by commas, e.g. 0,1")
    known = {seed for entry in GRID for seed in entry.seeds}
    if seeds - known:
        parser.error(f"unknown seeds {sorted(seeds - known)}; the grid has {sorted(known)}")
    return jobs(only or None, games or None, seeds or None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "list", "keep", "summary"))
    parser.add_argument("--root", default="runs/suite", help="the suite's run directories")
    parser.add_argument("--only", default="", help="entries to run, e.g. a2c,c51 (default: all)")
    parser.add_argument("--games", default="", help="games to run, e.g. breakout,pong")
    parser.add_argument("--seeds", default="", help="seeds to run, e.g. 0 (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once")
    parser.add_argument("--hours", type=float, default=None, help="stop (saved) after this long")
    parser.add_argument("--out", default=RESULTS, help="where summary.{json,png} go")
    args = parser.parse_args()
    todo = selected(parser, args)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.action in ("keep", "summary") and not os.path.isdir(args.root):
        parser.error(
            f"--root {args.root} is not a directory: give the suite's run directories (`run` "
            f"makes them) or the kept logs, {os.path.relpath(KEPT)}"
        )
    if args.action == "run":
        return run_grid(args.root, todo, args.jobs, args.hours)
    if args.action == "list":
        for job in todo:
            frames, here = progress(job, args.root), trained_frames(job.run_dir(args.root))
            where = "" if frames == here else " (kept logs)"
            print(f"{job.label:40s} {frames:>12,} / {job.entry.frames:,} frames{where}")
        return 0
    if args.action == "keep":
        copied, further = keep(args.root, todo)
        if not copied and not further:
            print(f"suite: no run under {args.root} has logs to keep")
        for label in copied:
            print(f"suite: kept the logs of {label} in {os.path.relpath(KEPT)}")
        for label in further:
            print(f"suite: {label}: the kept logs went further than the run directory; kept")
        return 0
    entries = summarize(args.root)
    if not any(entry["seeds"] for entry in entries):  # would overwrite the summary with blanks
        parser.error(f"no run of the suite under {args.root}: nothing to summarize")
    os.makedirs(args.out, exist_ok=True)
    results_file.write_json(os.path.join(args.out, "summary.json"), {"entries": entries})
    draw(entries, os.path.join(args.out, "summary.png"))
    print(table(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
