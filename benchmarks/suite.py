#!/usr/bin/env python3
"""The multi-game suite: one config per algorithm, on the games the Atari papers report first,
side by side with published results.

    .venv/bin/python benchmarks/suite.py run --root=runs/suite               # the whole grid
    .venv/bin/python benchmarks/suite.py run --root=runs/suite --only=a2c --hours=2.5
    .venv/bin/python benchmarks/suite.py run --root=runs/suite --seeds=0   # every first seed
    .venv/bin/python benchmarks/suite.py list --root=runs/suite              # what is done
    .venv/bin/python benchmarks/suite.py run --root=runs/mine --only=a2c --games=pong --seeds=0 \
        --retrain                                       # reproduce a run the kept logs hold
    .venv/bin/python benchmarks/suite.py keep --root=runs/suite              # logs into the repo
    .venv/bin/python benchmarks/suite.py keep --root=runs/mine --only=appo --retrain  # replace them
    .venv/bin/python benchmarks/suite.py summary --root=benchmarks/results/suite/runs

`run` trains each config x game x seed of the grid (`GRID` below) in its own run directory,
`<root>/<entry>/<game>/seed<k>`, one after another (`--jobs` at once), and skips what is done:
finished under `<root>` or in the committed logs (`--retrain` counts `<root>` alone). Every
run is an ordinary resumable run of `bin/train`, so the suite may be stopped at any moment (Ctrl-C,
SIGTERM, a lost machine) and the same command continues: an unfinished run resumes from its last
checkpoint (off-policy runs keep their replay in it). `--hours` gives every run the time left as
its wall limit, so that the last one saves and stops before the budget ends.

`keep` copies each run's logs (metrics.csv, eval.csv, operative_config.gin; not its checkpoints)
into benchmarks/results/suite/runs/, laid out like the run directories: a run directory lives on
the machine that trained it, the logs are committed, and `summary` reads either.

`summary` reads the run directories (or the kept logs) and the published references
(benchmarks/reference/) and writes benchmarks/results/suite/summary.json (one entry per config x
game: the seeds, their frames, the mean of the last 20 full games, wall time, agent steps/s, the
frames and minutes to the reference's score, the reference with its source and protocol, and a
verdict: ahead, level or behind) and summary.png (a panel per game: score against frames, the
mean and range over seeds, the reference marked); it prints the table of docs/results.md. That
half lives in suite_summary.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

import suite_summary  # noqa: E402
from suite_summary import frames_per_second, trained_frames  # noqa: E402

from tfaccel import guards  # noqa: E402
from tfaccel.bench import results as results_file  # noqa: E402

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
        reference: `<kind>:<agent>`, the published figure the verdict compares with
            (`suite_summary.load_reference`).
        context: another published curve, `<kind>:<agent>`, drawn beside the reference and
            cited in the table, not judged against ("" for none).
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
    context: str = ""
    bindings: tuple[str, ...] = ()


# The order runs are trained in: A2C first (cheap: about an hour per game), Pong and Breakout
# first among its games (the two that decided the presets' first layers), then C51, PPO and
# APPO, then the second seeds (on Pong, two seeds of each preset whose Pong run predates the
# background offset), the presets with Pong alone so far (A3C, DQN, ε-Rainbow) on Breakout, and
# C51's second seeds last ("where time allows").
A2C_GAMES = ("pong", "breakout", "space_invaders", "seaquest", "qbert", "beam_rider")
# Table 6's A2C (3 seeds, the mean of the last 100 games at 40M frames), and beside it the curve
# of Baselines' own a2c on its benchmark page (6 runs), which ends far lower on Q*bert.
A2C_REFERENCES = ("schulman2017:A2C", "baselines:A2C")
GRID = (
    Entry("a2c", "a2c.gin", "train", A2C_GAMES, (0,), 40_000_000, 0.0, *A2C_REFERENCES),
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
    Entry("a2c", "a2c.gin", "train", A2C_GAMES, (1,), 40_000_000, 0.0, *A2C_REFERENCES),
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
    Entry("appo", "appo.gin", "train", ("pong",), (1,), 20_000_000, 0.0, "baselines:PPO"),
    # APPO's first Breakout seed ended 13% under ppo2's mean: a second one tells noise from a gap.
    Entry("appo", "appo.gin", "train", ("breakout",), (1,), 10_000_000, 0.0, "baselines:PPO"),
    Entry("a3c", "a3c.gin", "train", ("pong",), (0, 1), 40_000_000, 0.0, *A2C_REFERENCES),
    Entry("a3c", "a3c.gin", "train", ("breakout",), (0,), 40_000_000, 0.0, *A2C_REFERENCES),
    Entry(
        "dqn", "dqn.gin", "train_off_policy", ("breakout",), (0,), 10_000_000, 0.25, "dopamine:DQN"
    ),  # fmt: skip
    Entry(
        "rainbow",
        "rainbow.gin",
        "train_off_policy",
        ("breakout",),
        (0,),
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


def progress(job: Job, root: str, kept: str | None = KEPT) -> int:
    """The frames a job has trained: those of its run directory under `root`, or of its kept
    logs under `kept` where they went further (a run finished on another machine, or before
    the run directories were cleared, is not trained again)."""
    frames = trained_frames(job.run_dir(root))
    return max(frames, trained_frames(job.run_dir(kept))) if kept else frames


def hours_left(todo: list[Job], root: str, kept: str | None = KEPT) -> list[float | None]:
    """Per job of `todo`, the hours of training its frames still take (0 for a finished job) at
    the mean speed of its entry's runs so far on any game, each run's frames over its wall time
    (under `root`, or in `kept` where those went further); None where none of them has a row."""
    speeds = {}
    for job in jobs():
        dirs = [job.run_dir(root)] + ([job.run_dir(kept)] if kept else [])
        if (speed := frames_per_second(max(dirs, key=trained_frames))) is not None:
            speeds.setdefault(job.entry.name, []).append(speed)
    hours = []
    for job in todo:
        left, rates = job.entry.frames - progress(job, root, kept), speeds.get(job.entry.name)
        if left <= 0:
            hours.append(0.0)
        else:
            hours.append(left / (sum(rates) / len(rates)) / 3600 if rates else None)
    return hours


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


def keep(
    root: str, todo: list[Job], into: str = KEPT, replace: bool = False
) -> tuple[list[str], list[str]]:
    """Copies the logs of each run that has any (`KEPT_FILES`, not its checkpoints) into
    `into/<entry>/<game>/seed<k>/`, which `summary --root` reads like the run directories
    themselves: a run directory lives on one machine, the suite's figures in the repository.
    Logs already kept that went further than the run directory's stay as they are, unless
    `replace` (a run trained again, e.g. after its preset changed): then the kept logs are
    those of the run directory alone, whatever they were.
    Returns the labels of the runs copied, and of those left alone."""
    import shutil

    copied, further = [], []
    for job in todo:
        source = job.run_dir(root)
        if not os.path.exists(os.path.join(source, "metrics.csv")):
            continue
        target = job.run_dir(into)
        if not replace and trained_frames(target) > trained_frames(source):
            further.append(job.label)
            continue
        os.makedirs(target, exist_ok=True)
        for name in KEPT_FILES:
            if os.path.exists(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            elif os.path.exists(os.path.join(target, name)):
                os.remove(os.path.join(target, name))  # the older run's, not this one's
        copied.append(job.label)
    return copied, further


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
    parser.add_argument(
        "--retrain",
        action="store_true",
        help="run and list: count only the runs under --root, not the committed logs (to "
        "reproduce a run that they hold); keep: the runs under --root replace the committed "
        "logs even where those went further",
    )
    args = parser.parse_args()
    todo = selected(parser, args)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.hours is not None and not args.hours > 0:  # NaN too
        parser.error(f"--hours must be more than 0 (leave it out for no limit), got {args.hours}")
    if args.action in ("keep", "summary") and not os.path.isdir(args.root):
        parser.error(
            f"--root {args.root} is not a directory: give the suite's run directories (`run` "
            f"makes them) or the kept logs, {os.path.relpath(KEPT)}"
        )
    kept = None if args.retrain else KEPT
    if args.action == "run":
        return run_grid(args.root, todo, args.jobs, args.hours, kept)
    if args.action == "list":
        hours = hours_left(todo, args.root, kept)
        for job, left in zip(todo, hours, strict=True):
            frames, here = progress(job, args.root, kept), trained_frames(job.run_dir(args.root))
            where = "" if frames == here else " (kept logs)"
            eta = f"  {left:.1f} h left" if left else ""
            print(f"{job.label:40s} {frames:>12,} / {job.entry.frames:,} frames{where}{eta}")
        unknown, known = [left for left in hours if left is None], [left for left in hours if left]
        if not unknown and not known:
            print(f"suite: all {len(todo)} runs are trained")
            return 0
        print(
            f"suite: {len(known) + len(unknown)} of {len(todo)} runs to train; {len(known)} take "
            f"about {sum(known):.0f} h at the speeds of their entries' runs so far"
            + (f", {len(unknown)} are of entries with no run yet" if unknown else "")
        )
        return 0
    if args.action == "keep":
        copied, further = keep(args.root, todo, replace=args.retrain)
        if not copied and not further:
            print(f"suite: no run under {args.root} has logs to keep")
        for label in copied:
            print(f"suite: kept the logs of {label} in {os.path.relpath(KEPT)}")
        for label in further:
            print(
                f"suite: {label}: the kept logs went further than the run directory; kept "
                f"(--retrain replaces them)"
            )
        return 0
    entries = suite_summary.summarize(args.root, jobs())
    if not any(entry["seeds"] for entry in entries):  # would overwrite the summary with blanks
        parser.error(f"no run of the suite under {args.root}: nothing to summarize")
    os.makedirs(args.out, exist_ok=True)
    results_file.write_json(os.path.join(args.out, "summary.json"), {"entries": entries})
    suite_summary.draw(entries, GAMES, os.path.join(args.out, "summary.png"))
    print(suite_summary.table(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
