"""Plays full games with an exported policy and prints the raw scores as JSON.

    tfaccel-eval --policy_dir=RUN_DIR/policy --episodes=10 [--gif=game.gif] [--mp4=game.mp4]

Each game is printed (on stderr) as it ends; the JSON on stdout has the mean and standard deviation of the
raw (unclipped) scores of full games. By default a policy plays as it was trained to (its no-op
starts, sticky actions and length limit) with epsilon 0.001, as Machado et al. (2018) evaluate:
a greedy policy that never presses FIRE would otherwise wait out the step limit in games that
need it (Breakout).

A --gif or --mp4 that could not be written (another ending, a directory, a missing directory) is
refused before the first game. Ctrl-C stops with one line, `stopped by SIGINT after N of M
games`, and exit status 130 (a SIGTERM: `stopped by SIGTERM ...` and 143); the JSON of the
games that ended is printed first.
"""

import json
import sys

from tfaccel import commands


def parse_flags(argv=None):
    parser = commands.parser(__doc__)
    parser.add_argument(
        "--policy_dir", required=True, help="a policy written by training (RUN_DIR/policy)"
    )
    parser.add_argument("--episodes", type=int, default=10, help="full games to play")
    parser.add_argument("--gif", default=None, help="write an animated GIF of the first game here")
    parser.add_argument(
        "--gif_every", type=int, default=None, help="the GIF shows every k-th step (default: 4)"
    )
    parser.add_argument(
        "--mp4", default=None, help="write an MP4 of the first game here: every step, real time"
    )
    parser.add_argument(
        "--epsilon",
        type=float,
        default=0.001,
        help="probability of a random action instead of the policy's (default 0.001)",
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help="draw actions from the policy's logits (policy-gradient) instead of the greedy one",
    )
    parser.add_argument(
        "--sticky_action_prob",
        type=float,
        default=None,
        help="per-frame probability of repeating the last action (default: the training env's)",
    )
    parser.add_argument(
        "--noop_max",
        type=int,
        default=None,
        help="a game starts with 1..noop_max random no-op frames (0: none; default: the policy's)",
    )
    parser.add_argument(
        "--max_agent_steps",
        type=int,
        default=None,
        help="a game ends after this many agent steps (default: the policy's)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the emulator, no-ops, epsilon draws, samples"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    flags = parse_flags(argv)
    if flags.gif_every is not None and flags.gif is None:
        commands.fail("--gif_every sets the frames of a GIF: give --gif=FILE.gif with it")
    commands.tensorflow_started_quietly()
    with commands.tensorflow_imported_quietly():
        from tfaccel import evaluate

    def report(game: int, score: float, steps: int) -> None:
        print(
            f"game {game + 1}/{flags.episodes}: {score:g} in {steps:,} agent steps", file=sys.stderr
        )

    try:
        result = evaluate.evaluate(
            flags.policy_dir,
            flags.episodes,
            epsilon=flags.epsilon,
            sample=flags.sample,
            sticky_action_prob=flags.sticky_action_prob,
            noop_max=flags.noop_max,
            max_agent_steps=flags.max_agent_steps,
            seed=flags.seed,
            gif=flags.gif,
            gif_every=4 if flags.gif_every is None else flags.gif_every,
            mp4=flags.mp4,
            on_game=report,
        )
    except (ValueError, OSError) as error:
        commands.fail(commands.first_line(error))
    except evaluate.Interrupted as stop:
        if stop.result is not None:
            print(json.dumps(stop.result, indent=2))
        commands.interrupted(f"after {stop.games} of {flags.episodes} games", stop)
    if "warning" in result:
        print(f"warning: {result['warning']}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


def run() -> None:
    """The `tfaccel-eval` console script (and `bin/eval`)."""
    commands.exit_with(main)


if __name__ == "__main__":
    run()
