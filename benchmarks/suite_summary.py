"""The multi-game suite's summary: each run's figures, the published reference they are held
to, a verdict, the table of docs/results.md and the figure (benchmarks/suite.py `summary`).

A run is read from its directory or from its kept logs alike (metrics.csv and
operative_config.gin): the mean raw score of the last 20 full games at each log row, the env
frames and the wall time, which accumulates across resumes. The references are the files of
benchmarks/reference/, each with its source and protocol.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfaccel.bench import results as results_file  # noqa: E402

REFERENCES = os.path.join(ROOT, "benchmarks", "reference")


def trained_frames(run_dir: str) -> int:
    """The env frames of a run directory's last metrics row (0 without one)."""
    return int(_last_row(run_dir).get("env_frames", 0))


def frames_per_second(run_dir: str) -> float | None:
    """A run's env frames per second of training: its last metrics row's frames over its wall
    time, which adds up across resumes (None without a row)."""
    row = _last_row(run_dir)
    return row["env_frames"] / row["wall_s"] if row.get("wall_s", 0) > 0 else None


def _last_row(run_dir: str) -> dict[str, float]:
    """The env frames and wall seconds of a run directory's last metrics row, those of its
    columns that parse ({} without a row; a row cut by a crash: the run itself will say what
    it is)."""
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    if len(lines) < 2:
        return {}
    row, parsed = dict(zip(lines[0].split(","), lines[-1].split(","), strict=False)), {}
    for name in ("env_frames", "wall_s"):  # a row cut short keeps the columns it has
        try:
            parsed[name] = float(row[name])
        except (KeyError, ValueError):
            pass
    return parsed


def title(game: str) -> str:
    """A game as the docs' tables name it: `space_invaders` -> `Space Invaders`, `qbert` ->
    `Q*bert`, `beam_rider` -> `BeamRider` (as Schulman et al. spell it)."""
    special = {"qbert": "Q*bert", "beam_rider": "BeamRider"}
    return special.get(game, " ".join(part.capitalize() for part in game.split("_")))


def camel(game: str) -> str:
    """`space_invaders` -> `SpaceInvaders`, as the papers' tables name games."""
    return "".join(part.capitalize() for part in game.split("_"))


def load_reference(kind_agent: str, game: str, frames: int) -> dict | None:
    """The published figure for `game` after `frames` (None where none is published): its
    source, protocol, mean, low and high over the published seeds (equal to the mean where only
    a mean is published), the agent and short name the table shows (`cite`), and, for curves,
    the curve itself."""
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
            "cite": (agent, f"Dopamine, iteration {frames // step - 1}"),
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
            "cite": (agent, "Schulman et al. 2017, Table 6"),
        }
    if kind == "baselines":  # a curve of Baselines' benchmark page, read at `frames`
        import numpy as np

        algorithm = {"PPO": "ppo2", "A2C": "a2c"}.get(agent)
        if algorithm is None:
            return None
        with open(os.path.join(REFERENCES, f"baselines_{algorithm}_atari10m.json")) as handle:
            document = json.load(handle)
        points = sorted(document["curves"].get(camel(game), []))
        if not points or points[-1][0] < 0.99 * frames:
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
            "cite": (algorithm, f"OpenAI Baselines, 6 runs, at {frames / 1e6:g}M frames"),
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


def seed_summary(run_dir: str, target: float | None = None) -> dict | None:
    """A run directory's figures, or None when it has no scored row yet. `reached` holds the
    frames and wall seconds of the first row at or above `target` (the reference's mean), the
    figure of merit of an accelerated method; None when no row got there."""
    from tfaccel import plot

    try:
        run = plot.load_run(run_dir)
    except ValueError:
        return None
    frames = trained_frames(run_dir)
    wall = float(run.wall_s[-1])
    first = None if target is None else results_file.first_at_least(list(run.score), target)
    return {
        "run_dir": os.path.relpath(run_dir),
        "frames": frames,
        "score": float(run.score[-1]),  # the mean of the last 20 full games
        "best": float(max(run.score)),
        "wall_s": wall,
        "agent_steps_per_s": frames / 4 / wall if wall > 0 else None,
        "curve": [[int(f), round(float(s), 2)] for f, s in zip(run.frames, run.score, strict=True)],
        "reached": None
        if first is None
        else {"frames": int(run.frames[first]), "wall_s": float(run.wall_s[first])},
    }


def summarize(root: str, jobs: list) -> list[dict]:
    """One entry per config x game of `jobs` (the suite's `Job`s), with its seeds' figures
    under `root`, its reference and its verdict, and the published curve drawn beside the
    reference (`context`, or None)."""
    entries = {}
    for job in jobs:
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
                "context": load_reference(job.entry.context, job.game, job.entry.frames)
                if job.entry.context
                else None,
            },
        )
        reference = entry["reference"]
        figures = seed_summary(job.run_dir(root), reference and reference["mean"])
        if figures is not None:
            entry["seeds"][str(job.seed)] = figures
    for entry in entries.values():
        done = [s for s in entry["seeds"].values() if s["frames"] >= entry["frames"]]
        entry["finished_seeds"] = len(done)
        entry["score"] = _spread([s["score"] for s in done]) if done else None
        reference = entry["reference"]
        if done:
            entry["verdict"] = (
                verdict(entry["score"][0], reference) if reference else "no reference"
            )
        else:
            entry["verdict"] = "in progress" if entry["seeds"] else "not run"
    return list(entries.values())


COLORS = {
    "a2c": "tab:blue",
    "a3c": "tab:cyan",
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


def draw(entries: list[dict], games: tuple[str, ...], path: str) -> None:
    """A panel per game of `games` (six at most): each entry's mean score over seeds against
    frames, its range shaded, and its reference (a curve, or a point with its range at the
    reference's frames)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, game in zip(axes.flat, games, strict=False):
        shared = {}  # a reference -> the entries held to it (PPO and APPO share ppo2's curve)
        for entry in [e for e in entries if e["game"] == game]:
            color = COLORS.get(entry["entry"], "black")
            curves = [seed["curve"] for seed in entry["seeds"].values() if seed["curve"]]
            if curves:
                grid, mean, low, high = seed_band(curves)
                label = f"{entry['entry']} ({seeds_text(entry['finished_seeds'], len(curves))})"
                axis.plot(grid / 1e6, mean, color=color, label=label)
                axis.fill_between(grid / 1e6, low, high, color=color, alpha=0.2)
            for which in ("reference", "context"):  # one file may hold several agents'
                if reference := entry[which]:  # figures: one curve, or a point at its frames
                    key = (which, reference["source"], reference["protocol"])
                    key += () if "curve" in reference else (reference["mean"],)
                    shared.setdefault(key, []).append(entry)
        for (which, *_), held in shared.items():
            _draw_reference(axis, held, which)
        axis.set_title(title(game))
        axis.set_xlabel("env frames (M)")
        axis.set_ylabel("raw score, last 20 games")
        axis.grid(alpha=0.3)
        if axis.has_data():
            axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _draw_reference(axis, held: list[dict], which: str = "reference") -> None:
    """One reference (`which`: the entries' "reference" or their "context") on a game's panel,
    in the colour of the first entry `held` to it and named after them all: a curve to the
    furthest of their frames (dashed; a context dotted), or a point with its range."""
    import numpy as np

    reference, names = held[0][which], ", ".join(dict.fromkeys(e["entry"] for e in held))
    color = COLORS.get(held[0]["entry"], "black")
    if "curve" in reference:
        x, mean, low, high = np.array(reference["curve"]).T
        cut = x <= max(e["frames"] for e in held) * 1.0001
        agent, name = reference["cite"]
        style, label = ("--", f"{names} ref.") if which == "reference" else (":", "")
        label = label or f"{names}: {name.split(',')[0]} {agent}"
        axis.plot(x[cut] / 1e6, mean[cut], style, color=color, label=label)
        axis.fill_between(x[cut] / 1e6, low[cut], high[cut], color=color, alpha=0.08)
        return
    frames = reference.get("frames") or held[0]["frames"]  # a point: the same figure for all
    error = [[reference["mean"] - reference["low"]], [reference["high"] - reference["mean"]]]
    axis.errorbar(frames / 1e6, reference["mean"], yerr=error, fmt="*", color=color,
                  markersize=12, label=f"{names} ref.")  # fmt: skip


def table(entries: list[dict]) -> str:
    """The summary as the Markdown table of docs/results.md: per config x game the finished
    seeds, the score (the mean of the last 20 full games at the last frame; with several seeds,
    their mean and range), the reference, the verdict, and when each seed first reached the
    reference's mean (frames and wall minutes, resumes included)."""
    lines = [
        "| config | game | frames | seeds | score | reference | verdict | reached the reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        unfinished = len(e["seeds"]) - e["finished_seeds"]
        count = f"{e['finished_seeds']}" + (f" + {unfinished} unfinished" if unfinished else "")
        game = title(e["game"]).replace("*", "\\*")  # Markdown
        lines.append(
            f"| `{e['config']}` | {game} | {e['frames'] / 1e6:g}M | {count} | {_score_cell(e)} | "
            f"{_reference_cell(e['reference'], e['context'])} | {e['verdict']} | "
            f"{_reached_cell(e)} |"
        )
    return "\n".join(lines)


def _score_cell(entry: dict) -> str:
    if entry["score"] is None:
        return "—"
    mean, low, high = entry["score"]
    done = [s for s in entry["seeds"].values() if s["frames"] >= entry["frames"]]
    if len(done) == 1:
        return f"{mean:,.1f} (best {done[0]['best']:,.1f})"
    return f"{mean:,.1f} (seeds {low:,.1f} to {high:,.1f})"


def _reference_cell(reference: dict | None, context: dict | None = None) -> str:
    """The reference as `agent mean[, seeds low to high] (source)`, and its context after
    "beside it"."""
    if reference is None:
        return "none published"
    agent, name = reference["cite"]
    spread = ""
    if reference["low"] < reference["high"]:
        spread = f", seeds {reference['low']:,.1f} to {reference['high']:,.1f}"
    cell = f"{agent} {reference['mean']:,.1f}{spread} ({name})"
    return cell + (f"; beside it {_reference_cell(context)}" if context else "")


def _reached_cell(entry: dict) -> str:
    """Per seed, `11.1M frames, 34 min` where it first reached the reference's mean, else `not
    reached` (a finished seed) or `not yet`; named `seed k: ...` where several seeds ran."""
    if entry["reference"] is None or not entry["seeds"]:
        return "—"
    cells = []
    for name, seed in entry["seeds"].items():
        if reached := seed["reached"]:
            cell = f"{reached['frames'] / 1e6:.1f}M frames, {reached['wall_s'] / 60:.0f} min"
        else:
            cell = "not reached" if seed["frames"] >= entry["frames"] else "not yet"
        cells.append(cell if len(entry["seeds"]) == 1 else f"seed {name}: {cell}")
    return "; ".join(cells)
