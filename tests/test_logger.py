"""MetricsLogger: the CSV contract of DESIGN.md across resumes and late columns."""

import csv
import io

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
