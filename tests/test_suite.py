"""benchmarks/suite.py and suite_summary.py: the grid's order, what counts as done, the verdict
rules and the summary of fabricated run directories against the published references."""

import os
import signal
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import suite  # noqa: E402
import suite_summary as summary  # noqa: E402


def test_verdicts_follow_the_rules():
    ranged = {"mean": 47.1, "low": 43.6, "high": 49.6}
    assert summary.verdict(50.0, ranged) == "ahead"  # above the mean
    assert summary.verdict(44.0, ranged) == "level"  # within the seeds' range
    assert summary.verdict(43.0, ranged) == "behind"
    only_mean = {"mean": 303.0, "low": 303.0, "high": 303.0}
    assert summary.verdict(280.0, only_mean) == "level"  # within 10% of a published mean
    assert summary.verdict(270.0, only_mean) == "behind"
    negative = {"mean": -6.0, "low": -6.0, "high": -6.0}
    assert (
        summary.verdict(-6.5, negative) == "level" and summary.verdict(-7.0, negative) == "behind"
    )


def test_every_run_is_listed_once_and_a2c_pong_comes_first():
    jobs = suite.jobs()
    keys = [(job.entry.name, job.game, job.seed) for job in jobs]
    assert len(keys) == len(set(keys))
    assert keys[0] == ("a2c", "pong", 0) and keys[1] == ("a2c", "breakout", 0)
    assert {key[1] for key in keys} == set(suite.GAMES)
    assert [job.label for job in suite.jobs({"ppo"}, {"breakout"})] == ["ppo/breakout/seed0"]
    firsts = suite.jobs({"c51"}, {"space_invaders"}, {0})  # not its second seed after it
    assert [job.label for job in firsts] == ["c51/space_invaders/seed0"]
    assert {job.seed for job in suite.jobs(seeds={1})} == {1}


def test_the_command_binds_the_trainer_the_game_the_seed_and_the_wall_limit():
    (job,) = [j for j in suite.jobs({"c51"}, {"qbert"}) if j.seed == 0]
    command = suite.command(job, "/r", wall_seconds=3600.7)
    assert (
        "--gin_file=categorical_dqn.gin" in command and "--root_dir=/r/c51/qbert/seed0" in command
    )
    bindings = [arg.split("=", 1)[1] for arg in command if arg.startswith("--gin_bindings")]
    assert bindings == [
        "AtariConfig.game = 'qbert'",
        "AtariConfig.sticky_action_prob = 0.25",
        "RunConfig.total_frames = 10000000",
        "RunConfig.seed = 0",
        "train_off_policy.checkpoint_replay = True",
        "RunConfig.max_wall_seconds = 3600",
    ]


def write_run(path, rows):
    os.makedirs(path)
    with open(os.path.join(path, "metrics.csv"), "w") as handle:
        handle.write("env_frames,agent_steps,wall_s,fps,episode_return_raw_mean,episodes\n")
        handle.writelines(f"{f},{f // 4},{f / 1e4},1000,{s},1\n" for f, s in rows)
    with open(os.path.join(path, "operative_config.gin"), "w") as handle:
        handle.write("RunConfig.seed = 0\n")


def test_ppo_and_appo_are_held_to_ppo2_at_their_own_frames():
    """Their reference was CleanRL's PPO after 40M frames, four times the frames of the runs."""
    for job in suite.jobs({"ppo", "appo"}):
        reference = summary.load_reference(job.entry.reference, job.game, job.entry.frames)
        points = {row[0]: row[1] for row in reference["curve"]}
        assert reference["seeds"] == 6 and max(points) >= job.entry.frames
        below = max(f for f in points if f <= job.entry.frames)
        above = min(f for f in points if f >= job.entry.frames)
        assert min(points[below], points[above]) <= reference["mean"]
        assert reference["mean"] <= max(points[below], points[above])
    breakout = summary.load_reference("baselines:PPO", "breakout", 10_000_000)
    assert breakout["mean"] == pytest.approx(71.5, abs=0.1)  # the page's curve at 2.5M timesteps
    assert breakout["curve"][-1][1] == pytest.approx(239.9, abs=0.1)  # and at its end, 40M frames
    assert summary.load_reference("baselines:PPO", "breakout", 80_000_000) is None  # beyond it
    assert summary.load_reference("baselines:PPO", "asterix", 10_000_000) is None  # not on the page


def test_a2c_is_judged_against_table_6_with_baselines_a2c_curve_beside_it(tmp_path):
    """Table 6's A2C on Q*bert (10,066, 3 seeds) is more than twice the end of the curve of
    Baselines' own a2c on its benchmark page (6 runs): the table shows both, the verdict follows
    Table 6, and the figure draws the curve dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = summary.load_reference("baselines:A2C", "qbert", 40_000_000)
    assert curve["mean"] == pytest.approx(4471.1, abs=0.1) and curve["seeds"] == 6
    assert curve["cite"] == ("a2c", "OpenAI Baselines, 6 runs, at 40M frames")
    assert summary.load_reference("baselines:A2C", "qbert", 10_000_000)["mean"] < 1000
    assert summary.load_reference("baselines:DQN", "qbert", 10_000_000) is None  # not read
    root = str(tmp_path)
    write_run(f"{root}/a2c/qbert/seed0", [(20_000_000, 2000.0), (40_000_000, 4400.0)])
    entries = {(e["entry"], e["game"]): e for e in summary.summarize(root, suite.jobs({"a2c"}))}
    qbert = entries["a2c", "qbert"]
    assert qbert["reference"]["mean"] == 10065.7 and qbert["context"]["mean"] == curve["mean"]
    assert qbert["verdict"] == "behind"  # level with the curve (within 10%), not with Table 6
    row = next(line for line in summary.table([qbert]).splitlines() if "Q\\*bert" in line)
    assert (
        "| A2C 10,065.7 (Schulman et al. 2017, Table 6); beside it a2c 4,471.1 (OpenAI "
        "Baselines, 6 runs, at 40M frames) | behind |"
    ) in row
    assert all(e["context"] is None for e in summary.summarize(root, suite.jobs({"c51"})))
    figure, axis = plt.subplots()
    summary._draw_reference(axis, [qbert], "context")
    (line,) = axis.get_lines()
    assert line.get_linestyle() == ":" and line.get_label() == "a2c: OpenAI Baselines a2c"
    assert line.get_xdata()[-1] == pytest.approx(40, abs=0.01)  # env frames (M)
    plt.close(figure)


def test_baselines_legend_names_each_algorithm_colour():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
    import baselines_curves

    page = (
        '<tr><td style="display: flex"><div style="display: flex">\n  ppo2\n  </div></td>\n'
        '  <td><div style="background-color:rgba(102, 194, 165, 1.0)">&nbsp;</div></td></tr>'
        '<tr><td style="display: flex"><div style="display: flex">a2c</div></td>'
        '<td><div style="background-color:rgba(255, 217, 47, 1.0)">&nbsp;</div></td></tr>'
    )
    assert baselines_curves.legend(page) == {"ppo2": "#66c2a5", "a2c": "#ffd92f"}


def test_a_summary_of_finished_and_unfinished_runs(tmp_path):
    root = str(tmp_path)
    write_run(f"{root}/c51/breakout/seed0", [(5_000_000, 20.0), (10_000_000, 48.0)])
    write_run(f"{root}/c51/qbert/seed0", [(5_000_000, 900.0)])  # halfway
    assert summary.trained_frames(f"{root}/c51/breakout/seed0") == 10_000_000
    entries = {(e["entry"], e["game"]): e for e in summary.summarize(root, suite.jobs())}
    breakout = entries["c51", "breakout"]
    assert breakout["score"] == (48.0, 48.0, 48.0) and breakout["verdict"] == "ahead"
    assert breakout["reference"]["mean"] == pytest.approx(47.1, abs=0.05)  # Dopamine, iteration 9
    assert breakout["seeds"]["0"]["agent_steps_per_s"] == pytest.approx(2_500_000 / 1000)
    assert entries["c51", "qbert"]["verdict"] == "in progress"
    assert entries["c51", "space_invaders"]["verdict"] == "not run"
    # Reached Dopamine's 47.1 at the row of 10M frames, 1,000 s of wall time into the run.
    assert breakout["seeds"]["0"]["reached"] == {"frames": 10_000_000, "wall_s": 1000.0}
    assert entries["c51", "qbert"]["seeds"]["0"]["reached"] is None  # 900 against 3,002
    table = summary.table(list(entries.values())).splitlines()
    assert (
        "| `categorical_dqn.gin` | Breakout | 10M | 1 | 48.0 (best 48.0) | C51 47.1, seeds 43.6 to "
        "49.6 (Dopamine, iteration 9) | ahead | 10.0M frames, 17 min |"
    ) in table
    qbert = next(line for line in table if "`categorical_dqn.gin` | Q\\*bert" in line)
    assert "| 10M | 0 + 1 unfinished | — |" in qbert and qbert.endswith("| in progress | not yet |")
    assert any("| `ppo.gin` | Space Invaders | 10M | 0 | — | ppo2 485.6" in line for line in table)
    summary.draw(list(entries.values()), suite.GAMES, str(tmp_path / "summary.png"))
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_the_hours_left_come_from_the_speed_of_the_entrys_runs_on_any_game(tmp_path, capsys):
    root, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    write_run(f"{kept}/c51/breakout/seed0", [(5_000_000, 20.0), (10_000_000, 48.0)])  # 1,000 s
    write_run(f"{root}/c51/qbert/seed0", [(2_000_000, 900.0)])  # 200 s: 10,000 frames/s too
    with open(f"{root}/c51/qbert/seed0/metrics.csv", "a") as handle:
        handle.write("8000000,2000000,2000.0,1000,950.0,1\n")  # slower since: 4,000 frames/s
    todo = suite.jobs({"c51", "appo"}, {"breakout", "qbert"}, {0})
    hours = dict(zip((job.label for job in todo), suite.hours_left(todo, root, kept), strict=True))
    speed = (10_000 + 4_000) / 2  # the mean of the entry's two runs, frames over wall seconds
    assert hours["c51/breakout/seed0"] == 0.0  # done in the kept logs
    assert hours["c51/qbert/seed0"] == pytest.approx(2_000_000 / speed / 3600)
    assert hours["appo/breakout/seed0"] is None  # no run of APPO yet
    assert summary.frames_per_second(str(tmp_path / "none")) is None
    with open(f"{root}/c51/qbert/seed0/metrics.csv") as handle:
        whole = handle.read()
    os.makedirs(f"{tmp_path}/cut")
    with open(f"{tmp_path}/cut/metrics.csv", "w") as handle:  # a crash in the last row's middle
        handle.write(whole + "9000000,22")
    assert summary.trained_frames(f"{tmp_path}/cut") == 9_000_000
    assert summary.frames_per_second(f"{tmp_path}/cut") is None
    sys_argv = sys.argv
    sys.argv = ["suite.py", "list", f"--root={root}", "--only=c51", "--seeds=0", "--retrain"]
    try:
        assert suite.main() == 0
    finally:
        sys.argv = sys_argv
    listed = capsys.readouterr().out.splitlines()  # --retrain: the committed logs not counted
    assert listed[1].endswith("8,000,000 / 10,000,000 frames  0.1 h left")  # 2M at 4,000/s
    assert listed[0].endswith("0 / 10,000,000 frames  0.7 h left")  # Breakout: 10M at 4,000/s
    assert listed[-1] == (
        "suite: 4 of 4 runs to train; 4 take about 2 h at the speeds of their entries' runs so far"
    )


def test_the_figure_counts_finished_seeds_and_names_unfinished_ones():
    """A seed the suite has only started is drawn, but not counted as a seed of the result."""
    assert summary.seeds_text(1, 1) == "1 seed"
    assert summary.seeds_text(2, 2) == "2 seeds"
    assert summary.seeds_text(1, 2) == "1 seed + 1 unfinished"
    assert summary.seeds_text(0, 1) == "0 seeds + 1 unfinished"


def test_kept_logs_summarize_like_the_run_directories(tmp_path):
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    write_run(f"{runs}/c51/breakout/seed0", [(5_000_000, 20.0), (10_000_000, 48.0)])
    os.makedirs(f"{runs}/c51/breakout/seed0/checkpoints")
    (tmp_path / "runs/c51/breakout/seed0/checkpoints/ckpt-1.index").write_bytes(b"big")
    assert suite.keep(runs, suite.jobs(), kept) == (["c51/breakout/seed0"], [])
    assert sorted(os.listdir(f"{kept}/c51/breakout/seed0")) == [
        "metrics.csv",
        "operative_config.gin",
    ]
    here, there = summary.summarize(runs, suite.jobs()), summary.summarize(kept, suite.jobs())
    for entry in (*here, *there):
        for seed in entry["seeds"].values():
            seed.pop("run_dir")
    assert here == there


def test_a_run_finished_in_the_kept_logs_is_neither_trained_again_nor_overwritten(tmp_path):
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    write_run(f"{kept}/c51/breakout/seed0", [(5_000_000, 20.0), (10_000_000, 48.0)])
    write_run(f"{runs}/c51/breakout/seed0", [(400_000, 1.0)])  # started again by mistake
    write_run(f"{runs}/c51/qbert/seed0", [(400_000, 150.0)])
    job, qbert = (j for j in suite.jobs({"c51"}, {"breakout", "qbert"}) if j.seed == 0)
    assert suite.progress(job, runs, kept) == 10_000_000
    assert suite.progress(job, runs, None) == 400_000
    assert suite.keep(runs, [job, qbert], kept) == (["c51/qbert/seed0"], ["c51/breakout/seed0"])
    assert summary.trained_frames(f"{kept}/c51/breakout/seed0") == 10_000_000
    assert summary.trained_frames(f"{kept}/c51/qbert/seed0") == 400_000
    # Only the unfinished job reaches bin/train; a finished one starts nothing.
    started = []

    class Process:
        def __init__(self, command, **_):
            started.append(command)
            self.returncode = 0

        def poll(self):
            return 0

    suite_process, suite.subprocess.Popen = suite.subprocess.Popen, Process
    try:
        assert suite.run_grid(runs, [job], 1, None, kept) == 0
        assert started == []
        assert suite.run_grid(runs, [qbert], 1, None, kept) == 0
    finally:
        suite.subprocess.Popen = suite_process
    assert len(started) == 1 and any("qbert" in part for part in started[0])
    # The caller's own Ctrl-C is back (a test session run in-process kept the grid's handler).
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_trained_again_replaces_the_kept_logs_only_when_asked(tmp_path):
    """After a preset changes, its rerun replaces the older run's kept logs, which went 32
    frames further: `keep --retrain`. Without it they stay."""
    runs, kept = str(tmp_path / "runs"), str(tmp_path / "kept")
    write_run(f"{kept}/appo/breakout/seed0", [(5_000_000, 20.0), (10_000_032, 51.0)])
    with open(f"{kept}/appo/breakout/seed0/eval.csv", "w") as handle:
        handle.write("env_frames,score\n10000032,50\n")  # the older run's evaluation
    write_run(f"{runs}/appo/breakout/seed0", [(5_000_000, 40.0), (10_000_000, 90.0)])
    (job,) = suite.jobs({"appo"}, {"breakout"}, {0})
    assert suite.keep(runs, [job], kept) == ([], ["appo/breakout/seed0"])
    assert summary.trained_frames(f"{kept}/appo/breakout/seed0") == 10_000_032
    assert suite.keep(runs, [job], kept, replace=True) == (["appo/breakout/seed0"], [])
    assert summary.trained_frames(f"{kept}/appo/breakout/seed0") == 10_000_000
    assert sorted(os.listdir(f"{kept}/appo/breakout/seed0")) == [
        "metrics.csv",
        "operative_config.gin",
    ]


def test_a_seed_short_of_the_others_does_not_cut_their_curve():
    finished = [(0, -21.0), (20_000_000, 18.0), (40_000_000, 20.0)]
    started = [(0, -21.0), (600_000, -20.0)]
    grid, mean, low, high = summary.seed_band([finished, started], points=5)
    assert grid[-1] == 40_000_000  # not 600k
    assert mean[-1] == low[-1] == high[-1] == 20.0  # the finished seed alone there
    assert low[0] == high[0] == mean[0] == -21.0


def test_a_root_without_runs_is_refused_and_leaves_the_results_as_they_were(tmp_path, capsys):
    """`summary` of a missing root wrote an all-blank summary over the committed one."""
    out = tmp_path / "out"

    def main(*args):
        sys_argv = sys.argv
        sys.argv = ["suite.py", *args, f"--out={out}"]
        try:
            return suite.main()
        finally:
            sys.argv = sys_argv

    assert main("list", f"--root={tmp_path / 'missing'}") == 0  # the kept logs' progress
    assert "40,000,000 / 40,000,000 frames (kept logs)" in capsys.readouterr().out
    # --retrain counts the root alone: a user reproducing a committed run.
    assert main("list", f"--root={tmp_path / 'missing'}", "--only=a2c", "--retrain") == 0
    listed = capsys.readouterr().out
    assert "a2c/pong/seed0" in listed and "(kept logs)" not in listed
    assert listed.splitlines()[0].split() == ["a2c/pong/seed0", "0", "/", "40,000,000", "frames"]
    for action in ("summary", "keep"):
        with pytest.raises(SystemExit) as stopped:
            main(action, f"--root={tmp_path / 'missing'}")
        assert stopped.value.code == 2
        assert "is not a directory: give the suite's run directories" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main("summary", f"--root={tmp_path / 'empty'}")
    assert "no run of the suite under" in capsys.readouterr().err and not out.exists()
    for hours in ("-1", "0", "nan"):  # -1 started a run and stopped it at once
        with pytest.raises(SystemExit):
            main("run", f"--root={tmp_path / 'empty'}", f"--hours={hours}")
        assert "--hours must be more than 0 (leave it out for no limit)" in capsys.readouterr().err
    assert os.listdir(tmp_path / "empty") == []


def test_entries_held_to_one_reference_share_its_line_and_others_keep_theirs(tmp_path, monkeypatch):
    """PPO and APPO share ppo2's curve: it was drawn twice, one line over the other. Dopamine's
    agents come from one file each game, yet each is its own curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = {
        (e["entry"], e["game"]): e for e in summary.summarize(str(tmp_path), suite.jobs())
    }  # none run
    drawn = []
    draw_reference = summary._draw_reference
    monkeypatch.setattr(
        summary,
        "_draw_reference",
        lambda axis, held, which: drawn.append((which, [e["entry"] for e in held])),
    )
    summary.draw(list(entries.values()), suite.GAMES, str(tmp_path / "summary.png"))
    assert ("reference", ["ppo", "appo"]) in drawn  # Breakout and Space Invaders at 10M frames
    assert ("reference", ["appo", "ppo"]) in drawn  # Pong at 20M frames (APPO's entry first)
    for name in ("c51", "dqn", "rainbow"):  # Pong: three lines
        assert ("reference", [name]) in drawn
    # A2C and A3C share Table 6's point and, beside it, Baselines' a2c curve, on Pong and Breakout.
    assert drawn.count(("reference", ["a2c", "a3c"])) == 2
    assert drawn.count(("context", ["a2c", "a3c"])) == 2
    assert drawn.count(("context", ["a2c"])) == 4  # the other four games
    figure, axis = plt.subplots()
    draw_reference(axis, [entries["ppo", "breakout"], entries["appo", "breakout"]])
    assert axis.get_legend_handles_labels()[1] == ["ppo, appo ref."]
    plt.close(figure)


def test_the_docstring_examples_hold():
    import doctest

    outcome = doctest.testmod(summary)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_seeds_are_named_in_the_reached_column_and_no_reference_is_not_in_progress(
    tmp_path, monkeypatch
):
    root = str(tmp_path)
    write_run(f"{root}/c51/breakout/seed0", [(5_000_000, 20.0), (10_000_000, 48.0)])
    write_run(f"{root}/c51/breakout/seed1", [(2_000_000, 9.0)])
    row = next(line for line in summary.table(summary.summarize(root, suite.jobs())).splitlines()
               if "`categorical_dqn.gin` | Breakout" in line)  # fmt: skip
    assert "| 1 + 1 unfinished | 48.0 (best 48.0) |" in row
    assert row.endswith("| ahead | seed 0: 10.0M frames, 17 min; seed 1: not yet |")
    # A finished entry without a published figure was "in progress", and "not reached".
    monkeypatch.setattr(summary, "load_reference", lambda *_: None)
    entries = {(e["entry"], e["game"]): e for e in summary.summarize(root, suite.jobs())}
    assert entries["c51", "breakout"]["verdict"] == "no reference"
    assert entries["c51", "qbert"]["verdict"] == "not run"
    row = next(line for line in summary.table(list(entries.values())).splitlines()
               if "`categorical_dqn.gin` | Breakout" in line)  # fmt: skip
    assert row.endswith("| none published | no reference | — |")


def test_the_docs_table_and_summary_json_are_those_of_the_kept_runs():
    """docs/results.md shows the table `suite.py summary` prints from the kept logs, and
    summary.json holds the same entries: a run kept without regenerating both fails here."""
    import json

    entries = summary.summarize(suite.KEPT, suite.jobs())
    table = summary.table(entries).splitlines()
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as handle:
        docs = handle.read().splitlines()
    start = docs.index(table[0])
    assert docs[start : start + len(table)] == table
    with open(os.path.join(suite.RESULTS, "summary.json"), encoding="utf-8") as handle:
        kept = json.load(handle)["entries"]
    assert kept == json.loads(json.dumps(entries))
