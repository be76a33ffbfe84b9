"""tfaccel.plot and bin/plot on fabricated run directories."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfaccel import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "env_frames,agent_steps,wall_s,fps,episode_return_raw_mean,episodes\n"


def make_run(path, scores, seed=0, config="train.learning_rate = 0.0007"):
    os.makedirs(path)
    rows = [
        f"{(i + 1) * 1000},{(i + 1) * 250},{10.0 * (i + 1)},100,{score},{i}\n"
        for i, score in enumerate(scores)
    ]
    with open(os.path.join(path, "metrics.csv"), "w") as handle:
        handle.write(HEADER + "".join(rows))
    with open(os.path.join(path, "operative_config.gin"), "w") as handle:
        handle.write(f"{config}\ntrain.seed = {seed}\n")
    return str(path)


def test_runs_alike_up_to_the_seed_are_one_curve_with_a_range(tmp_path):
    seeds = [
        make_run(tmp_path / "ppo_s0", [-21, -15, -5], seed=0),
        make_run(tmp_path / "ppo_s1", [-19, -9, 5], seed=1),
    ]
    other = make_run(tmp_path / "a2c", ["nan", -20, -20], config="train.learning_rate = 0.001")
    by_frames = plot.curves([plot.load_run(d) for d in [*seeds, other]], axis="frames")
    assert [c.label for c in by_frames] == ["ppo (2 seeds)", "a2c"]
    pair = by_frames[0]
    assert pair.x[0] == 1000 and pair.x[-1] == 3000
    assert pair.mean[0] == -20 and pair.mean[-1] == 0  # (-21 - 19) / 2, (-5 + 5) / 2
    assert pair.low[-1] == -5 and pair.high[-1] == 5
    np.testing.assert_array_equal(by_frames[1].x, [2000, 3000])  # the unscored row is left out


def test_bin_plot_writes_a_png_and_names_bad_directories(tmp_path):
    run = make_run(tmp_path / "c51", [-21, -10, 3])
    out = tmp_path / "curves.png"
    done = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={run}", f"--out={out}", "--target=18"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "c51: 3,000 frames, final 3.0, best 3.0" in done.stdout  # it said 0.0M
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={tmp_path}", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0
    assert (bad.stdout + bad.stderr).strip().splitlines() == [  # one line, not a warning too
        f"error: nothing to plot: {tmp_path} is not a run directory: it has no metrics.csv"
    ]
    unwritable = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={run}", f"--out={tmp_path}/no/curves.png"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert unwritable.returncode == 1 and unwritable.stdout == ""
    assert unwritable.stderr.splitlines() == [  # it ended with [Errno 2] No such file or ...
        f"error: cannot write out={tmp_path}/no/curves.png: the directory {tmp_path}/no does "
        "not exist"
    ]
    with pytest.raises(ValueError, match="out must be a file name, got .*, which is a directory"):
        plot.plot([run], str(tmp_path))
    # Without an extension matplotlib wrote curves.png while the command said it wrote curves.
    bare = tmp_path / "curves"
    plot.plot([run], str(bare))
    assert (
        bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curves.png.png").exists()
    )
    plot.plot([run], str(tmp_path / "curves.svg"))
    assert b"<svg" in (tmp_path / "curves.svg").read_bytes()[:500]


def test_a_run_without_finished_games_is_named(tmp_path):
    run = make_run(tmp_path / "fresh", ["nan"])
    with pytest.raises(ValueError, match="has no finished games yet"):
        plot.load_run(run)


def test_plot_leaves_out_a_run_without_finished_games_and_says_so(tmp_path):
    """It drew nothing (an error) when one of its runs had no finished game yet."""
    played = make_run(tmp_path / "played", [-21, -10, 3])
    fresh = make_run(tmp_path / "fresh", ["nan", "nan"], config="train.learning_rate = 0.1")
    out = tmp_path / "curves.png"
    done = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={played}", f"--run_dir={fresh}", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"warning: left out: {fresh}/metrics.csv has no finished games yet" in done.stderr
    assert "played: 3,000 frames, final 3.0" in done.stdout and out.exists()


def test_plot_of_runs_without_any_finished_game_draws_the_axes_and_warns_once(tmp_path):
    """It ended with `error: nothing to plot` after every smoke run, whose end prints a
    tfaccel-plot command (and the README's run.plot)."""
    fresh = make_run(tmp_path / "fresh", ["nan", "nan"])
    other = make_run(tmp_path / "other", ["nan"], config="train.learning_rate = 0.1")
    out = tmp_path / "curves.png"
    done = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={fresh}", f"--run_dir={other}", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"warning: no finished game yet in fresh (2,000 frames), other (1,000 frames): {out} "
        "shows empty axes; plot again once a game has ended"
    ]
    assert done.stdout == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = []
    assert plot.plot([fresh], str(tmp_path / "api.png"), warn=lines.append) == []
    assert len(lines) == 1 and (tmp_path / "api.png").exists()


def test_the_empty_figure_has_the_usual_axes_and_a_note_naming_the_runs(tmp_path, monkeypatch):
    import matplotlib.figure

    fresh = make_run(tmp_path / "fresh", ["nan"])
    saved = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda figure, *a, **k: saved.append(figure)
    )
    plot.plot([fresh], str(tmp_path / "curves.png"), warn=lambda line: None)
    (figure,) = saved
    for axes, xlabel in zip(
        figure.axes, ["env frames (millions)", "wall time (minutes)"], strict=True
    ):
        assert axes.get_xlabel() == xlabel
        assert axes.get_ylabel() == "raw score (mean of the last 20 games)"
        assert [text.get_text() for text in axes.texts] == [
            "no finished game yet in fresh (1,000 frames)"
        ]
        assert axes.texts[0].get_position() == (0.5, 0.5) and not axes.lines


def test_runs_of_which_none_is_a_run_directory_are_still_an_error(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot: .* is not a run directory"):
        plot.plot([str(tmp_path)], str(tmp_path / "curves.png"), warn=lambda line: None)
    assert not (tmp_path / "curves.png").exists()


def test_every_command_lists_its_flags_on_help_and_exits_0():
    for command, flags in (  # and defaults, which --help did not give
        ("train", ["--root_dir", "--gin_file", "--gin_bindings", "\n    tfaccel-train --gin"]),
        ("eval", ["--policy_dir", "--episodes", "--gif", "--epsilon", "play (default: 10)"]),
        ("plot", ["--run_dir", "--out", "--target", "(default: curves.png)"]),
        ("bench_sampler", ["--game", "--seconds", "--json", "--plot", "(default: pong)"]),
        ("pool_demo", ["--game", "--seconds", "--workers", "--envs_per_worker"]),  # it exited 1
    ):
        done = subprocess.run(
            [sys.executable, f"bin/{command}", "--help"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stderr[-2000:])
        assert all(flag in done.stdout for flag in flags), (command, done.stdout)
        assert done.stderr == "", (command, done.stderr)  # no TensorFlow start-up lines


@pytest.mark.parametrize(
    "args, start",
    [
        (["a2c.gin", "--gin_file=catch_a2c.gin"], "error: unrecognized arguments: a2c.gin"),
        (["--gin_fil=catch_a2c.gin"], "error: unrecognized arguments: --gin_fil=catch_a2c.gin"),
        (["--gin_file=catch_a2c.gin", "--root_dir"], "error: argument --root_dir: expected one"),
    ],
    ids=["stray", "unknown", "no_value"],
)
def test_a_stray_argument_is_one_line_not_a_silent_run(tmp_path, args, start):
    done = subprocess.run(
        [sys.executable, "bin/train", f"--root_dir={tmp_path}/x", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith(start), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "x")


def test_repeats_of_one_seed_are_runs_and_a_directory_twice_or_a_bad_target_is_refused(tmp_path):
    """Two runs of seed 0 were labelled `2 seeds`; a directory given twice was averaged with
    itself; `target='high'` drew a category axis, and nan nothing."""
    repeats = [make_run(tmp_path / f"crash_{i}", [1, 2, 3], seed=0) for i in range(2)]
    (curve,) = plot.curves([plot.load_run(d) for d in repeats], axis="frames")
    assert curve.label == "crash (2 runs, 1 seed)"
    out = str(tmp_path / "c.png")
    with pytest.raises(ValueError, match=r"run directory given twice: .*crash_0; give each once"):
        plot.plot([repeats[0], repeats[1], os.path.join(repeats[0], "")], out)
    for target in ("high", float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"target must be a finite score \(a number\), got"):
            plot.plot(repeats, out, target=target)
    assert not os.path.exists(out)


def test_a_metrics_table_without_a_curves_columns_or_with_bad_rows_is_named(tmp_path):
    """A metrics.csv without env_frames was a KeyError traceback; one unreadable row (a hand
    edit, damaged bytes) refused the whole plot; a metrics.csv that is a directory was a bare
    [Errno 21]."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.csv").write_text("env_frames,agent_steps,episode_return_raw_mean\n1,1,1\n")
    missing = r"metrics.csv is not a tfaccel metrics table: it has no wall_s column \(its columns: "
    with pytest.raises(ValueError, match=missing + "env_frames, agent_steps, episode_return"):
        plot.load_run(str(other))
    edited = make_run(tmp_path / "edited", [-21, -10, 3])
    with open(os.path.join(edited, "metrics.csv"), "a") as handle:
        handle.write("4000,1000,40.0,100,xyz,4\n5000,1250,abc,100,1,5\n6000,1500,60.0,1")
    with open(os.path.join(edited, "metrics.csv"), "ab") as handle:
        handle.write(b"\n7000,1750,70.0,100,\xff\xfe,7\n8000,2000,80.0,100,9.0,8\n9000,22")
    warnings = []
    run = plot.load_run(edited, warn=warnings.append)
    np.testing.assert_array_equal(run.frames, [1000, 2000, 3000, 8000])  # the cut last row: out
    np.testing.assert_array_equal(run.score, [-21, -10, 3, 9])
    assert warnings == [
        f"warning: {edited}/metrics.csv: left out 4 unreadable row(s) (a hand edit or damaged "
        "bytes)"
    ]
    folder = tmp_path / "folder"
    (folder / "metrics.csv").mkdir(parents=True)
    with pytest.raises(ValueError, match="metrics.csv is not a file"):
        plot.load_run(str(folder))
