"""Evaluation of an exported policy: full games, raw scores, optionally a GIF or an MP4 (`bin/eval`).

The games are played by `tfaccel.policy_client`, the client that needs no tfaccel, from the
policy's `tfaccel_policy.json` alone: an evaluation checks the artifact a user gets, not the
training process's objects. The protocol is `AtariConfig.evaluation()`'s: no episodic life, raw
(unclipped) rewards, and the policy's own no-op starts, sticky actions and game length limit (its
training env's, as the json records them) unless given here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np
from PIL import Image  # Pillow comes with matplotlib

from tfaccel import policy_client


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C (or a SIGTERM that the caller turned into a KeyboardInterrupt with a
    `signal_name`, as the commands do) during `evaluate`: still a KeyboardInterrupt, with the
    summary of the games that had ended before it.

    Attributes:
        result: what `evaluate` returns, of the finished games alone and with `stopped_by`
            `SIGINT` or `SIGTERM` (None: no game had ended).
        games: how many games had ended.
        signal_name: `SIGINT` or `SIGTERM`.
    """

    def __init__(self, result: dict | None, games: int, signal_name: str = "SIGINT"):
        super().__init__(f"stopped by {signal_name} after {games} games")
        self.result, self.games, self.signal_name = result, games, signal_name


def evaluate(
    policy_dir: str,
    episodes: int,
    *,
    epsilon: float = 0.0,
    sample: bool = False,
    sticky_action_prob: float | None = None,
    noop_max: int | None = None,
    max_agent_steps: int | None = None,
    seed: int = 0,
    gif: str | None = None,
    gif_every: int = 4,
    mp4: str | None = None,
    on_game=None,
) -> dict:
    """Plays `episodes` full games with the policy in `policy_dir` and summarizes the scores.

    Args:
        policy_dir: a directory written by `tfaccel.export.export_policy`.
        episodes: number of full games, played one after another.
        epsilon: probability of a uniformly random action instead of the policy's.
        sample: draw the actions from the policy's logits (a policy-gradient policy as it
            trained) instead of taking the greedy one.
        sticky_action_prob: per-frame probability that the emulator repeats the last action
            (None: the policy's, i.e. its training env's).
        noop_max: a game starts with 1..noop_max random no-op frames (0: none; None: the
            policy's).
        max_agent_steps: a game ends after this many agent steps (None: the policy's).
        seed: seeds the emulator, the no-ops, the epsilon draws and the samples.
        gif: where to write an animated GIF of the first game (None: no GIF).
        gif_every: the GIF shows every k-th agent step.
        mp4: where to write an H.264 video of the first game, every agent step in real time
            (60 / frame_skip frames per second, screens scaled ×2; needs `tfaccel[video]`).
        on_game: called as `on_game(index, score, length)` as each game ends.

    Returns:
        `episodes`, `mean`, `std`, `min`, `max` of the raw scores, `scores` and `lengths` (agent
        steps) per game, `policy_dir`, `game`, `actions` (`greedy` or `sampled`), `epsilon`,
        `at_step_limit` (games that ended by the step limit, not by a game over: a policy stuck,
        e.g. waiting for FIRE, with a `warning`), and with a GIF `gif` (path, frames, frame_ms),
        with an MP4 `mp4` (path, frames, fps).

    Raises:
        ValueError: a setting is out of range, the policy directory is missing or not a tfaccel
            Atari policy, `sample` on a policy without logits, a video's path does not end in
            `.gif` (`.mp4`), is a directory or is in a directory that does not exist, or `mp4`
            without imageio-ffmpeg. All before any game is played.
        Interrupted: a Ctrl-C; it carries the summary of the games that had ended. A video is
            written whole or not at all.
    """
    _check_settings(episodes, epsilon, sticky_action_prob, noop_max, max_agent_steps, seed)
    _check_videos(gif, gif_every, mp4)
    metadata = policy_client.read_metadata(policy_dir)  # before TensorFlow starts, for errors
    preprocessing = metadata.get("preprocessing")
    if preprocessing is None:
        raise ValueError(
            f"{policy_dir} is the policy of a non-Atari env (its tfaccel_policy.json has no "
            "Atari preprocessing), and evaluation plays Atari games only: play it on your env "
            "with tfaccel.load_policy(dir)(observations)"
        )
    if sample:
        policy_client.check_can_sample(metadata, policy_dir)
    policy, _ = policy_client.load_policy(policy_dir)
    record_every = 1 if mp4 else gif_every if gif else 0  # a GIF takes every k-th of them
    given = dict(
        sticky_action_prob=sticky_action_prob, noop_max=noop_max, max_agent_steps=max_agent_steps
    )
    ended = []  # (score, length) of each game as it ends, for a summary after a Ctrl-C

    def game_ended(index: int, score: float, length: int) -> None:
        ended.append(policy_client.GameRecord(score, length, []))
        if on_game is not None:
            on_game(index, score, length)

    summary = dict(
        policy_dir=policy_dir, preprocessing=preprocessing, sample=sample, epsilon=epsilon,
        max_agent_steps=max_agent_steps,
    )  # fmt: skip
    try:
        records = policy_client.play_games(
            policy,
            preprocessing,
            episodes,
            seed=seed,
            epsilon=epsilon,
            sample=sample,
            record_every=record_every,
            on_game=game_ended,
            **{name: value for name, value in given.items() if value is not None},
        )
        result = _summary(records, **summary)
        _write_videos(result, records[0].frames, preprocessing, gif, gif_every, mp4, record_every)
    except KeyboardInterrupt as stop:
        name = getattr(stop, "signal_name", "SIGINT")
        partial = (_summary(ended, **summary) | dict(stopped_by=name)) if ended else None
        raise Interrupted(partial, len(ended), name) from None
    return result


def _write_videos(result, screens, preprocessing, gif, gif_every, mp4, record_every) -> None:
    """Writes the first game's `screens` as the GIF and the MP4 asked for, and adds where to
    `result`."""
    if gif:
        frames = screens[:: gif_every // record_every]
        frame_ms = gif_frame_ms(gif_every, preprocessing["frame_skip"])
        write_gif(frames, gif, frame_ms)
        result["gif"] = dict(path=os.path.abspath(gif), frames=len(frames), frame_ms=frame_ms)
    if mp4:
        fps = 60 / preprocessing["frame_skip"]
        write_mp4(screens, mp4, fps)
        result["mp4"] = dict(path=os.path.abspath(mp4), frames=len(screens), fps=fps)


def _check_videos(gif: str | None, gif_every: int, mp4: str | None) -> None:
    """Raises a ValueError for a video that could not be written, before any game is played."""
    _check_count("gif_every", gif_every, 1)
    for name, path in (("gif", gif), ("mp4", mp4)):
        if path is not None:
            check_output_file(path, name, f".{name}")
    if mp4 is not None:
        _ffmpeg()  # missing: say so before playing


def check_output_file(path: str, name: str, suffix: str | None = None) -> None:
    """Raises a one-line ValueError for a file that cannot be written at `path`, to be called
    before the work that makes it (the games of `evaluate`, the figure of `tfaccel.plot.plot`).

    Args:
        path: where the file goes.
        name: the setting (and flag) that gave `path`, named in the message: `gif`, `out`, ...
        suffix: the ending `path` must have (`.gif`), lower or upper case; None: any.

    Raises:
        ValueError: `path` does not end in `suffix`, is a directory, or its directory does not
            exist or cannot be written to, e.g. `gif must be a file name ending in .gif, got
            'out.png'` or `cannot write out=/tmp/nope/p.png: the directory /tmp/nope does not
            exist`.
    """
    wanted = f"a file name ending in {suffix}" if suffix else "a file name"
    if os.path.isdir(path) or path.endswith((os.sep, "/")):
        raise ValueError(f"{name} must be {wanted}, got {path!r}, which is a directory")
    if suffix and not path.lower().endswith(suffix.lower()):
        raise ValueError(f"{name} must be {wanted}, got {path!r}")
    directory = os.path.dirname(path)
    if not os.path.isdir(directory or os.curdir):
        raise ValueError(f"cannot write {name}={path}: the directory {directory} does not exist")
    try:  # a trial file, as the real one is written (beside it, then moved): what permissions,
        # a read-only mount or a full inode table allow, which os.access cannot tell for root
        with tempfile.NamedTemporaryFile(dir=directory or os.curdir, prefix=".tfaccel-probe-"):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write {name}={path}: the directory {directory or os.curdir} takes no new "
            f"file ({error.strerror or error}); give a path in a directory you can write to"
        ) from error


@contextlib.contextmanager
def _written_whole(path: str) -> Iterator[str]:
    """Yields a temporary path beside `path` (with its ending) to write to; moves it to `path`
    when the block ends normally and removes it otherwise: a failed or interrupted write leaves
    no partial file (and an older `path` as it was)."""
    directory, base = os.path.split(os.path.abspath(path))
    stem, ending = os.path.splitext(base)
    temporary = os.path.join(directory, f".{stem}.{os.getpid()}.partial{ending}")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def _summary(records, policy_dir, preprocessing, sample, epsilon, max_agent_steps) -> dict:
    """The scores of the games played and how they were played; a warning when games ran to
    the step limit (see `evaluate`)."""
    episodes = len(records)
    scores = np.array([record.score for record in records], np.float64)
    result = dict(
        episodes=episodes,
        mean=float(scores.mean()),
        std=float(scores.std()),
        min=float(scores.min()),
        max=float(scores.max()),
        scores=scores.tolist(),
        lengths=[record.length for record in records],
        policy_dir=os.path.abspath(policy_dir),
        game=preprocessing["game"],
        actions="sampled" if sample else "greedy",
        epsilon=epsilon,
    )
    limit = max_agent_steps or preprocessing["max_agent_steps"]
    stuck = sum(record.length >= limit for record in records)
    result["at_step_limit"] = stuck
    if stuck:
        result["warning"] = (
            f"{stuck} of {episodes} games ran to the step limit ({limit:,} agent steps) without "
            "a game over: the policy may be stuck"
            + ("" if sample else " (a game that needs FIRE to start, played greedily?)")
            + ", or the limit is shorter than a game"
        )
    return result


def _check_settings(episodes, epsilon, sticky_action_prob, noop_max, max_agent_steps, seed):
    _check_count("episodes", episodes, 1)
    _check_probability("epsilon", epsilon)
    if sticky_action_prob is not None:
        _check_probability("sticky_action_prob", sticky_action_prob)
    if noop_max is not None:
        _check_count("noop_max", noop_max, 0)
    if max_agent_steps is not None:
        _check_count("max_agent_steps", max_agent_steps, 1)
    _check_count("seed", seed, 0)


def _check_count(name: str, value, low: int) -> None:
    """A one-line ValueError unless `value` is an integer (not a bool) of at least `low`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_probability(name: str, value) -> None:
    """A one-line ValueError unless `value` is a number in [0, 1] (not NaN, not a bool)."""
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    )
    if not (number and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def gif_frame_ms(every: int, frame_skip: int) -> int:
    """Real-time display length of one GIF frame (every k-th agent step, 60 emulator frames/s).

    GIFs count time in centiseconds, so the result is rounded to 10 ms: `gif_frame_ms(4, 4)` is
    270 (16 emulator frames are 266.7 ms).
    """
    return max(10, 10 * round(100 * every * frame_skip / 60))


def write_gif(frames: Sequence[np.ndarray], path: str, frame_ms: int) -> None:
    """Writes RGB frames [H, W, 3] uint8 as a looping GIF, `frame_ms` per frame.

    Identical consecutive frames become one frame shown for their summed time (Pillow merges
    them), so the file may hold fewer frames than given but always lasts len(frames) * frame_ms.
    """
    images = [Image.fromarray(np.asarray(frame, np.uint8)) for frame in frames]
    with _written_whole(path) as partial:
        images[0].save(
            partial, "GIF", save_all=True, append_images=images[1:], duration=frame_ms, loop=0
        )


def _ffmpeg():
    """The imageio_ffmpeg module (an ffmpeg binary in a wheel), or a ValueError naming the extra."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ValueError(
            "writing an MP4 needs imageio-ffmpeg: pip install 'tfaccel[video]' (or use --gif)"
        ) from None
    return imageio_ffmpeg


def write_mp4(frames: Sequence[np.ndarray], path: str, fps: float, scale: int = 2) -> None:
    """Writes RGB frames [H, W, 3] uint8 as an H.264 MP4 (yuv420p, plays in browsers and
    notebooks) at `fps`, each pixel shown as a `scale` × `scale` block; whole or not at all."""
    height, width = frames[0].shape[:2]
    with _written_whole(path) as partial:
        writer = _ffmpeg().write_frames(
            partial, (width * scale, height * scale), fps=fps, codec="libx264",
            pix_fmt_out="yuv420p", macro_block_size=1, quality=8,
        )  # fmt: skip
        writer.send(None)  # starts ffmpeg
        try:
            for frame in frames:
                big = np.repeat(np.repeat(np.asarray(frame, np.uint8), scale, 0), scale, 1)
                writer.send(np.ascontiguousarray(big))
        finally:
            writer.close()
