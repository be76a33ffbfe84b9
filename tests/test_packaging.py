"""The release check: a wheel built from the checkout installs in a clean virtual environment,
and from outside the checkout its commands run the quick start (train a smoke run, eval with a
GIF, plot) and the Python API trains twice in one process. In `make test-all` only (it installs
TensorFlow into a new environment: a few minutes, from pip's cache when it has one)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.full, pytest.mark.timeout(1500)]


def sh(*args, cwd, env=None, timeout=900):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
    return done


def test_a_wheel_installs_and_its_commands_run_the_quick_start(tmp_path):
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
       ROOT, cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("tfaccel-*.whl")
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    sh(str(venv / "bin" / "pip"), "install", "-q", str(wheel), cwd=tmp_path)
    away = tmp_path / "elsewhere"  # no checkout, no gin_configs/ beside it
    away.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    train = sh("tfaccel-train", "--gin_file=a2c.gin", "--gin_file=smoke.gin",
               "--root_dir=runs/smoke", cwd=away, env=env)  # fmt: skip
    assert "done: 2,000 frames" in train.stdout and "tfaccel-eval --policy_dir=" in train.stdout
    assert "oneDNN" not in train.stderr and "cuda" not in train.stderr.lower()
    evaluated = sh("tfaccel-eval", "--policy_dir=runs/smoke/policy", "--episodes=1",
                   "--max_agent_steps=40", "--gif=game.gif", cwd=away, env=env)  # fmt: skip
    assert '"lengths": [\n    40\n  ]' in evaluated.stdout and (away / "game.gif").exists()
    catch = sh("tfaccel-train", "--gin_file=catch_a2c.gin", "--gin_file=smoke.gin",
               "--root_dir=runs/catch", cwd=away, env=env)  # fmt: skip
    assert catch.returncode == 0
    plotted = sh("tfaccel-plot", "--run_dir=runs/catch", "--out=curves.png", cwd=away, env=env)
    assert "wrote curves.png" in plotted.stdout and (away / "curves.png").exists()
    # Its end-to-end row trains with the installed package's command (there is no bin/ here).
    # (10 s: a row needs 2 metrics rows, on a loaded machine too; 5 s once gave 1)
    sh("tfaccel-bench", "--seconds=10", "--layouts=", "--inference_layouts=",
       "--training_layouts=1x2", "--peers=", "--json=bench.json", cwd=away, env=env)  # fmt: skip
    rows = json.loads((away / "bench.json").read_text())["results"]
    assert [row["inference"] for row in rows] == ["training"] and rows[0]["sps"] > 0
    for command in ("tfaccel-train", "tfaccel-eval", "tfaccel-plot", "tfaccel-bench"):
        assert "--" in sh(command, "--help", cwd=away, env=env).stdout
    api = (
        "import tfaccel\n"
        "a = tfaccel.train(['catch_a2c.gin', 'smoke.gin'], 'runs/api_a2c')\n"
        "b = tfaccel.train(['catch_dqn.gin', 'smoke.gin'], 'runs/api_dqn')\n"
        "print('api', a.summary['env_frames'], b.summary['env_frames'], len(b.metrics))\n"
    )
    out = sh(str(venv / "bin" / "python"), "-c", api, cwd=away, env=env).stdout
    assert out.strip().splitlines()[-1].startswith("api 2")
