"""What a run reports: metrics.csv, TensorBoard scalars, and a progress line.

`metrics.csv` gets one row per log interval and is appended to on resume, after `rewind` has
dropped the rows of the work lost since the restored checkpoint (so each frame count appears once).
A row that brings new columns (the losses, once learning starts after a replay warm-up) rewrites
the file once with the wider header; earlier rows leave those cells empty. On a terminal the
progress line rewrites itself; elsewhere (CI, a log file) each interval is one plain line.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import sys
import time

import tensorflow as tf

from tfaccel.console import io_failure

REQUIRED_COLUMNS = (
    "env_frames",
    "agent_steps",
    "wall_s",
    "fps",
    "episode_return_raw_mean",
    "episodes",
)


class MetricsLogger:
    """Writes rows of scalars to `root_dir/<name>.csv` and to TensorBoard under `root_dir/tb`
    (`metrics`) or `root_dir/tb/<name>` (any other name, e.g. `eval`)."""

    def __init__(self, root_dir: str, name: str = "metrics", stream=None):
        self.path = os.path.join(root_dir, f"{name}.csv")
        self._columns: list[str] | None = None
        self._stream = stream or sys.stdout
        self._live = hasattr(self._stream, "isatty") and self._stream.isatty()
        if os.path.exists(self.path):
            self._read_existing()
        board = (
            os.path.join(root_dir, "tb")
            if name == "metrics"
            else os.path.join(root_dir, "tb", name)
        )
        with written(board):
            self._writer = tf.summary.create_file_writer(board)

    def _read_existing(self) -> None:
        """Takes the header of an existing file and drops the rows a resumed run cannot append
        to: a last row cut short (a crash while it was written: the next row would be glued to
        it), a blank line, a row with another number of cells or a frame count that is not an
        integer (a hand edit), bytes that are not text (a damaged disk block); says how many,
        naming the file."""
        with open(self.path, newline="", errors="replace") as handle:
            text = handle.read()
        lines = text.split("\n")
        complete = text.endswith("\n")
        rows = list(csv.reader(lines[:-1]))  # a last line without its newline is cut short
        if not rows:
            return  # empty, or only a cut header: written anew
        self._columns, body = rows[0], rows[1:]
        frames_at = self._columns.index("env_frames") if "env_frames" in self._columns else 0

        def whole(row):
            if len(row) != len(self._columns) or any("\ufffd" in cell for cell in row):
                return False
            try:
                int(row[frames_at])
            except ValueError:
                return False
            return True

        kept = [row for row in body if whole(row)]
        dropped = len(body) - len(kept) + (0 if complete or not lines[-1] else 1)
        if dropped:
            self._rewrite(kept)
            self.message(
                f"warning: {self.path}: dropped {dropped} unreadable row(s) (a row cut short by "
                "a crash, a blank line, a hand edit or damaged bytes); the frames after the last "
                "checkpoint are logged again, earlier ones leave a gap in the curve"
            )

    def write(self, row: dict) -> None:
        """Appends `row` (column -> scalar; `env_frames` required) to the CSV and TensorBoard."""
        with written(os.path.dirname(self.path)):
            self._write(row)

    def _write(self, row: dict) -> None:
        if self._columns is None:
            required = [name for name in REQUIRED_COLUMNS if name in row]
            self._columns = required + sorted(set(row) - set(required))
            with open(self.path, "w", newline="") as handle:
                csv.writer(handle).writerow(self._columns)
        elif set(row) - set(self._columns):
            self._widen(sorted(set(row) - set(self._columns)))
        with open(self.path, "a", newline="") as handle:
            csv.writer(handle).writerow([_format(row.get(name, "")) for name in self._columns])
        with self._writer.as_default(step=int(row["env_frames"])):
            for name, value in row.items():
                if isinstance(value, (int, float)) and name != "env_frames":
                    tf.summary.scalar(name, value)
        self._writer.flush()

    def rewind(self, env_frames: int) -> int:
        """Drops the rows logged after `env_frames` (work a crash lost: the run resumes from a
        checkpoint at `env_frames` and logs those frames again); returns how many it dropped.
        TensorBoard keeps its events: it shows the redone stretch twice."""
        if self._columns is None:
            return 0
        rows = self._rows()
        frames_at = self._columns.index("env_frames")
        kept = [row for row in rows if int(row[frames_at]) <= env_frames]
        if len(kept) < len(rows):
            self._rewrite(kept)
        return len(rows) - len(kept)

    def rows(self) -> int:
        """How many rows the file holds below its header."""
        return 0 if self._columns is None else len(self._rows())

    def last_frames(self) -> int | None:
        """The env frames of the last row (None without one)."""
        rows = [] if self._columns is None else self._rows()
        return int(rows[-1][self._columns.index("env_frames")]) if rows else None

    def _widen(self, new_columns: list[str]) -> None:
        """Rewrites the file with `new_columns` added to the header (atomically)."""
        old_rows = self._rows()
        self._columns = self._columns + new_columns
        self._rewrite([old + [""] * len(new_columns) for old in old_rows])

    def _rows(self) -> list[list[str]]:
        """The file's rows below its header (bytes that are not text read as U+FFFD: a damaged
        header is not an error; `_read_existing` dropped the damaged rows)."""
        with open(self.path, newline="", errors="replace") as handle:
            return list(csv.reader(handle))[1:]

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Replaces the file by the header and `rows` (atomically)."""
        temporary = self.path + ".partial"
        with open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(self._columns)
            writer.writerows(rows)
        os.replace(temporary, self.path)

    @property
    def live(self) -> bool:
        """Whether progress goes to a terminal (a line that rewrites itself)."""
        return self._live

    def end_progress(self) -> None:
        """Ends a live progress line, so that what follows starts on a line of its own."""
        if self._live:
            self._stream.write("\n")
            self._stream.flush()

    def progress(self, text: str, final: bool = False) -> None:
        """Shows `text` as the live progress line (a terminal), or as a plain line."""
        if self._live:
            self._stream.write("\r" + text.ljust(110)[:160] + ("\n" if final else ""))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def message(self, text: str) -> None:
        """Prints `text` on a line of its own (warnings, resume notes, evaluations)."""
        if self._live:
            self._stream.write("\n")
        self._stream.write(text + "\n")
        self._stream.flush()


@contextlib.contextmanager
def written(path: str):
    """Writes to `path` (metrics.csv, TensorBoard's events) whose failure (a full disk, a
    directory made read-only) is one OSError naming it and the way on, not TensorFlow's
    traceback or an errno without a path."""
    try:
        yield
    except (OSError, tf.errors.OpError) as error:
        raise OSError(
            f"could not write the run's logs in {path}: {io_failure(error)}; once it can be "
            "written, the "
            "same command resumes from the last checkpoint"
        ) from error


def clock(seconds: float) -> str:
    """`h:mm:ss` of a duration: `clock(3725)` is `1:02:05`."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """The progress display of a run: on a terminal it refreshes every `every` seconds, not only
    at log rows, with the training time (across resumes: `trained_seconds` before this start), the rate (smoothed over the last refreshes), its
    split, the score and an h:mm ETA; elsewhere (a log file, CI) one plain line per log row.

    Example: `12,000/20,000 frames  0:05:12  410 steps/s (env 4% infer 19% learn 76%)  score 14.2
    replay 48,000  ETA 0:05`
    """

    def __init__(self, log: MetricsLogger, total_frames: int, frame_skip: int, frames: int,
                 every: float = 2.0, now=time.monotonic, trained_seconds: float = 0.0):  # fmt: skip
        self._log, self._total, self._skip, self._every, self._now = (
            log, total_frames, frame_skip, every, now
        )  # fmt: skip
        self._start = self._then = now()
        self._start -= trained_seconds  # a resumed run's clock goes on from its checkpoint
        self._frames, self._rate = frames, None

    def due(self) -> bool:
        """Whether a refresh of the terminal's line is due."""
        return self._log.live and self._now() - self._then >= self._every

    def show(self, frames: int, score: float, split: tuple, extra: str = "") -> None:
        """Shows the line at `frames` (`split`: the fractions of time in env, inference, learning)."""
        now = self._now()
        if now > self._then and frames > self._frames:
            rate = (frames - self._frames) / (now - self._then)  # frames/s since the last line
            self._rate = rate if self._rate is None else 0.7 * self._rate + 0.3 * rate
        self._then, self._frames = now, frames
        rate = self._rate or 0.0
        left = max(self._total - frames, 0) / rate if rate else None  # seconds
        eta = "-" if left is None else clock(60 * math.ceil(left / 60))[:-3]  # h:mm, rounded up
        env, inference, learn = split
        self._log.progress(
            f"{frames:,}/{self._total:,} frames  {clock(now - self._start)}  "
            f"{rate / self._skip:,.0f} steps/s (env {env:.0%} infer {inference:.0%} "
            f"learn {learn:.0%})  "
            + (f"score {score:.1f}" if score == score else "score - (no game ended yet)")
            + extra
            + f"  ETA {eta}"
        )


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
