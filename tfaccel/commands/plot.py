"""Plots learning curves: raw score against frames and against wall time.

    tfaccel-plot --run_dir=runs/c51_pong --run_dir=runs/rainbow_pong --out=pong.png
    tfaccel-plot --run_dir=runs/ppo_s0 --run_dir=runs/ppo_s1 --target=18 --out=ppo.png

Runs whose operative configs differ only in their seeds become one curve (the mean, with the
range over seeds shaded). A run without a finished game yet is left out with a warning; when no
run has one (a smoke run), the figure has empty axes with a note naming the runs, and a warning.
"""

import sys

from tfaccel import commands


def parse_flags(argv=None):
    parser = commands.parser(__doc__)
    parser.add_argument(
        "--run_dir",
        action="append",
        required=True,
        help="a run directory (with its metrics.csv), repeatable",
    )
    parser.add_argument("--out", default="curves.png", help="the PNG to write")
    parser.add_argument("--title", default=None, help="a title over the two panels")
    parser.add_argument("--target", type=float, default=None, help="a dashed line at this score")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    flags = parse_flags(argv)
    from tfaccel import plot

    try:
        curves = plot.plot(
            flags.run_dir,
            flags.out,
            title=flags.title,
            target=flags.target,
            warn=lambda line: print(line, file=sys.stderr),
        )
    except (ValueError, OSError) as error:  # OSError: --out cannot be written (a full disk)
        commands.fail(commands.first_line(error))
    for curve in curves:
        frames = curve.x[-1]
        reached = f"{frames / 1e6:.1f}M" if frames >= 1e6 else f"{frames:,.0f}"
        print(
            f"{curve.label}: {reached} frames, final {curve.mean[-1]:.1f}, "
            f"best {curve.mean.max():.1f}"
        )
    print(f"wrote {flags.out}")
    return 0


def run() -> None:
    """The `tfaccel-plot` console script (and `bin/plot`)."""
    commands.exit_with(main)


if __name__ == "__main__":
    run()
