"""MetricsLogger: the CSV contract of docs/architecture.md across resumes and late columns."""

import csv
import io
import re

import pytest
import tensorflow as tf

from tfaccel.logger import MetricsLogger


def read(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def row(frames, **extra):
    base = dict(env_frames=frames, agent_steps=frames // 4, wall_s=1.0, fps=10.0)
    return dict(base, episode_return_raw_mean=-21.0, episodes=1, **extra)


def test_late_columns_widen_the_header_and_keep_earlier_rows(tmp_path):
    log = MetricsLogger(str(tmp_path), stream=io.StringIO())
    log.write(row(400, epsilon=0.9))  # a replay warm-up: no loss yet
    log.write(row(800, epsilon=0.8, loss=0.5, q_mean=0.1))
    rows = read(tmp_path / "metrics.csv")
    assert [r["env_frames"] for r in rows] == ["400", "800"]
    assert rows[0]["loss"] == "" and rows[1]["loss"] == "0.5" and rows[1]["q_mean"] == "0.1"
    header = next(csv.reader(open(tmp_path / "metrics.csv")))
    assert header[:6] == ["env_frames", "agent_steps", "wall_s", "fps"] + [
        "episode_return_raw_mean",
        "episodes",
    ]


def test_a_resumed_logger_appends_under_the_existing_header(tmp_path):
    MetricsLogger(str(tmp_path), stream=io.StringIO()).write(row(400, loss=1.0))
    resumed = MetricsLogger(str(tmp_path), stream=io.StringIO())
    resumed.write(row(800, loss=2.0))
    resumed.write(row(1200, loss=3.0, grad_norm=4.0))
    rows = read(tmp_path / "metrics.csv")
    assert [r["loss"] for r in rows] == ["1", "2", "3"]
    assert [r["grad_norm"] for r in rows] == ["", "", "4"]


def test_rewind_drops_the_rows_after_the_restored_checkpoint(tmp_path):
    crashed = MetricsLogger(str(tmp_path), stream=io.StringIO())
    for frames in (400, 800, 1200, 1600):  # the crash came after the checkpoint at 800
        crashed.write(row(frames, loss=frames / 400))
    resumed = MetricsLogger(str(tmp_path), stream=io.StringIO())
    assert resumed.rewind(800) == 2
    resumed.write(row(1200, loss=9.0))
    rows = read(tmp_path / "metrics.csv")
    assert [r["env_frames"] for r in rows] == ["400", "800", "1200"]
    assert rows[-1]["loss"] == "9"
    assert resumed.rewind(1200) == 0
    assert MetricsLogger(str(tmp_path / "new"), stream=io.StringIO()).rewind(0) == 0


def test_progress_refreshes_on_a_terminal_with_a_smoothed_rate_and_an_eta(tmp_path):
    import io

    from tfaccel.logger import Progress, clock

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert clock(3725) == "1:02:05"
    screen = Terminal()
    log = MetricsLogger(str(tmp_path), stream=screen)
    now = [100.0]
    display = Progress(log, 1_000_000, 4, 0, every=2.0, now=lambda: now[0])
    assert not display.due()
    now[0] = 102.0
    assert display.due()
    display.show(20_000, float("nan"), (0.1, 0.2, 0.7))  # 10,000 frames/s: 2,500 steps/s
    assert "20,000/1,000,000 frames  0:00:02  2,500 steps/s (env 10% infer 20% learn 70%)" in (
        screen.getvalue()
    )
    assert "score - (no game ended yet)  ETA 0:02" in screen.getvalue()  # 98 s left: rounded up
    now[0] = 104.0
    display.show(24_000, 3.5, (0.1, 0.2, 0.7), "  replay 6,000")
    # smoothed: 0.7 x 10,000 + 0.3 x 2,000 frames/s = 7,600 -> 1,900 steps/s
    assert screen.getvalue().endswith(
        "1,900 steps/s (env 10% infer 20% learn 70%)  score 3.5  replay 6,000  ETA 0:03"
    )
    now[0] = 106.0
    display.show(992_000, 3.5, (0.1, 0.2, 0.7))  # under a minute left: it said 0:00
    assert screen.getvalue().rstrip().endswith("ETA 0:01")
    log.end_progress()
    assert screen.getvalue().endswith("\n")
    piped = io.StringIO()  # not a terminal: no refresh between log rows, plain lines
    quiet = Progress(MetricsLogger(str(tmp_path), stream=piped), 100, 4, 0, now=lambda: 1e9)
    assert not quiet.due()
    # A resumed run's clock goes on from the training time of its checkpoint; it restarted at 0.
    resumed = Progress(log, 1_000_000, 4, 500_000, now=lambda: now[0], trained_seconds=3_600)
    now[0] = 108.0
    resumed.show(520_000, 3.5, (0.1, 0.2, 0.7))
    assert "520,000/1,000,000 frames  1:00:02  " in screen.getvalue()


def test_a_cut_last_row_blank_lines_and_hand_edits_are_dropped_with_the_files_name(tmp_path):
    """A row cut by a crash was glued to the next one written; a blank line or a hand-edited
    frame count gave a traceback that did not name the file."""
    first = MetricsLogger(str(tmp_path), stream=io.StringIO())
    for frames in (400, 800, 1200):
        first.write(row(frames, loss=1.0))
    path = tmp_path / "metrics.csv"
    text = path.read_text()
    lines = text.splitlines()
    lines.insert(2, "")  # a blank line
    lines[1] = lines[1].replace("400", "four hundred", 1)  # a hand edit
    path.write_text("\n".join(lines)[:-5])  # the last row cut short, no newline
    with open(path, "r+b") as handle:  # bytes that are not UTF-8 in the 800 row: it was an
        data = handle.read()  # error naming no file, and the run would not resume
        handle.seek(0)
        handle.write(data.replace(b"800,200,", b"800,2\xff\xfe00,", 1))
    screen = io.StringIO()
    resumed = MetricsLogger(str(tmp_path), stream=screen)
    assert f"warning: {path}: dropped 4 unreadable row(s)" in screen.getvalue()
    assert resumed.rewind(1200) == 0
    resumed.write(row(1200, loss=2.0))
    assert [r["env_frames"] for r in read(path)] == ["1200"]


def test_a_full_disk_while_logging_is_one_error_naming_the_directory(tmp_path, monkeypatch):
    """TensorFlow's summary writer on a full disk raised a 75-line ResourceExhaustedError."""
    log = MetricsLogger(str(tmp_path), stream=io.StringIO())
    log.write(row(400))

    def full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{tmp_path}/tb/events.out; No space left on device"
        )

    monkeypatch.setattr(tf.summary, "scalar", full)
    with pytest.raises(OSError, match=re.escape(
        f"could not write the run's logs in {tmp_path}: No space left on device; once it can be "
        "written, the same command resumes from the last checkpoint"
    )):  # fmt: skip
        log.write(row(800))


def test_a_header_with_bytes_that_are_not_text_still_resumes(tmp_path):
    """Rows were read again without the replacement of bad bytes: a damaged header failed the
    rewind of a resume with a UnicodeDecodeError."""
    first = MetricsLogger(str(tmp_path), stream=io.StringIO())
    for frames in (400, 800):
        first.write(row(frames, loss=1.0))
    path = tmp_path / "metrics.csv"
    path.write_bytes(path.read_bytes().replace(b"wall_s", b"wall\xff\xfe", 1))
    resumed = MetricsLogger(str(tmp_path), stream=io.StringIO())
    assert resumed.rewind(400) == 1
    resumed.write(row(800, loss=2.0, late=3.0))  # a new column: the file is rewritten wider
    assert [r["env_frames"] for r in read(path)] == ["400", "800"]
