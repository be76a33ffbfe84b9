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
    assert [c.label for c in by_frames] == ["ppo_s (2 seeds)", "a2c"]
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
    assert "c51: 0.0M frames, final 3.0, best 3.0" in done.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={tmp_path}", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0
    assert (
        bad.stderr.strip().splitlines()[-1]
        == f"error: {tmp_path} is not a run directory: it has no metrics.csv"
    )
    unwritable = subprocess.run(
        [sys.executable, "bin/plot", f"--run_dir={run}", f"--out={tmp_path}/no/curves.png"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert unwritable.returncode != 0 and "Traceback" not in unwritable.stderr
    assert "No such file or directory" in unwritable.stderr.strip().splitlines()[-1]


def test_a_run_without_finished_games_is_named(tmp_path):
    run = make_run(tmp_path / "fresh", ["nan"])
    with pytest.raises(ValueError, match="has no finished games yet"):
        plot.load_run(run)
