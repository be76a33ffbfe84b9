#!/usr/bin/env python3
"""Reads one algorithm's learning curves out of OpenAI Baselines' Atari10M benchmark page into
baselines_<algorithm>_atari10m.json: ppo2's (the suite's PPO and APPO reference at the frames
they run) and a2c's (drawn beside the A2C entries' reference, Schulman et al.'s Table 6).

The page (`benchmarks_atari10M.htm` in openai/baselines) draws each game's curves as vector SVG:
a curve is a path of 100 points in pixels, and the axes' ticks give the pixels of known values.
Each point is mapped through a straight-line fit of the ticks (exact: the ticks lie on a line to
1e-9), so the figures are the page's own, not read by eye. An algorithm's colour is read from
the page's legend.

    git clone https://github.com/openai/baselines && cd baselines
    for algorithm in ppo2 a2c; do
      python <tfaccel>/benchmarks/reference/baselines_curves.py --page=benchmarks_atari10M.htm \
          --algorithm=$algorithm --commit=$(git rev-parse HEAD) \
          --out=<tfaccel>/benchmarks/reference/baselines_${algorithm}_atari10m.json
    done
"""

import argparse
import json
import re

import numpy as np

FRAME_SKIP = 4  # the page's x axis counts agent steps ("timesteps")


def ticks(svg: str, axis: str) -> np.ndarray:
    """[(pixel, value)] of the ticks of `axis` ('x' or 'y') of one plot."""
    found = []
    pattern = rf'<g id="{axis}tick_\d+">(.*?)</g>\s*<g id="text_\d+">\s*<text[^>]*>(.*?)</text>'
    for match in re.finditer(pattern, svg, re.S):
        x, y = re.search(r'd="M ([\d.]+) ([\d.]+)', match.group(1)).groups()
        found.append((float(x if axis == "x" else y), float(match.group(2).replace("\u2212", "-"))))
    return np.array(found)


def legend(page: str) -> dict[str, str]:
    """{algorithm: '#rrggbb'}: the page's legend, where a row names an algorithm and the next
    cell shows its colour."""
    name = r'<div style="display: flex">\s*([\w.-]+)\s*</div>\s*</td>\s*'
    swatch = r'<td><div style="background-color:rgba\((\d+), (\d+), (\d+)'
    return {
        algorithm: "#" + "".join(f"{int(channel):02x}" for channel in rgb)
        for algorithm, *rgb in re.findall(name + swatch, page)
    }


def curve(svg: str, steps_per_unit: float, colour: str) -> list[list[float]]:
    """The curve drawn in `colour` on one plot as [(env frames, score)], in the order it is
    drawn."""
    x_fit, y_fit = (np.polyfit(*ticks(svg, axis).T, 1) for axis in ("x", "y"))
    lines = [
        match.group(1)
        for match in re.finditer(r'<path[^>]*d="([^"]+)"[^>]*style="([^"]*)"', svg, re.S)
        if f"stroke:{colour}" in match.group(2) and f"fill:{colour}" not in match.group(2)
    ]
    points = [re.findall(r"[ML] ([\d.]+) ([\d.]+)", line) for line in lines]
    (path,) = [p for p in points if len(p) >= 10]  # the line itself, not its legend mark
    return [
        [
            round(max(0.0, float(np.polyval(x_fit, float(px)))) * steps_per_unit * FRAME_SKIP),
            round(float(np.polyval(y_fit, float(py))), 2),
        ]
        for px, py in path
    ]


ENV = (
    "the Nature CNN; the number of envs is the command's --num_env or else the CPU count of "
    "the machine, which the page does not give; gym <Game>NoFrameskip-v4 (no sticky actions), "
    "30 no-op starts, frame skip 4 with max-pooling, 84x84 grayscale, 4 frames, episodic life "
    "and clipped rewards in training; the score is the raw full-game return of training "
    "episodes (the Monitor wrapper sits inside the life-loss wrapper)"
)
PROTOCOLS = {  # each algorithm's defaults for Atari at baselines commit 7bfbcf1
    "ppo2": (
        "OpenAI Baselines ppo2 (the PPO paper's implementation) with its Atari defaults: 128 "
        "steps per env, 4 epochs x 4 minibatches, Adam 2.5e-4 and clip 0.1 both annealed to 0 "
        "over 10M timesteps, " + ENV
    ),
    "a2c": (
        "OpenAI Baselines a2c (the A2C of Schulman et al. 2017, Table 6) with its defaults: 5 "
        "steps per env, RMSProp 7e-4 (decay 0.99, epsilon 1e-5) annealed linearly to 0 over "
        "10M timesteps, entropy 0.01, value 0.5, gradient norm 0.5, " + ENV
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", required=True, help="benchmarks_atari10M.htm of openai/baselines")
    parser.add_argument("--algorithm", required=True, choices=sorted(PROTOCOLS))
    parser.add_argument(
        "--commit", required=True, help="the openai/baselines commit it was read at"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.page, encoding="utf-8") as handle:
        page = handle.read()
    caption = re.sub(r"<[^>]+>|\s+", " ", page.split("Learning Curves", 1)[1])[:200]
    assert "avg. over 6 runs" in caption and "timesteps" in caption, caption
    colour = legend(page)[args.algorithm]
    curves = {}
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        game = re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S)[-1].strip()
        # The x ticks read 0.0 .. 1.0 under an offset label "1e7" (agent steps).
        curves[game] = curve(svg, 1e7 if ticks(svg, "x")[:, 1].max() <= 1.0 else 1.0, colour)
    document = {
        "source": (
            f"openai/baselines benchmarks_atari10M.htm at commit {args.commit} (MIT license): "
            "the 'Atari10M Comparison' page, its runs made at baselines commit 7bfbcf1 ('cron'); "
            f"{args.algorithm}'s learning curve of each game, read from the page's SVG paths by "
            "benchmarks/reference/baselines_curves.py"
        ),
        "what": (
            "curves[game]: [env frames, score] points, 100 per game, as drawn: 'X-axis: "
            "timesteps, Y-axis: reward (avg. over 6 runs)'; timesteps are agent steps, times 4 "
            "here for env frames (10M timesteps = 40M frames). The page does not say how the "
            "episodes are windowed or smoothed before the average; it gives no spread."
        ),
        "protocol": PROTOCOLS[args.algorithm],
        "curves": curves,
    }
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")


if __name__ == "__main__":
    main()
