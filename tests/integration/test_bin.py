"""The real bin/ entry points: artifacts, and one clear line for user errors."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.fakes import as_from_a_terminal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_the_benchs_policy_starts_tensorflow_quietly_from_a_script_or_notebook():
    """sampler_speed.ipynb calls the library, not the command: its cell showed TensorFlow's C++
    start-up lines (oneDNN, the CUDA probe) twice, TF_CPP_MIN_LOG_LEVEL set or not."""
    code = (
        "from tfaccel.bench import sampler; from tfaccel.envs.atari import AtariConfig\n"
        "policy = sampler.make_policy(AtariConfig(game='pong')(0).spec, 2)\n"
        "import numpy as np; print(policy(np.zeros([2, 104, 80, 4], np.uint8)).shape)"
    )
    result = run("-c", code)
    assert result.returncode == 0 and result.stdout.strip() == "(2,)", result.stderr[-3000:]
    assert not re.search(r"oneDNN|cuInit|cuda|absl", result.stderr), result.stderr


def test_tensorflows_interactive_info_logging_is_quieted_once_and_a_users_level_kept():
    """In a notebook TensorFlow's logger is at INFO (each export printed "INFO:tensorflow:Assets
    written to ..." twice); tfaccel sets that default to warnings once, not a level of the user's."""
    code = (
        "import sys; sys.ps1 = '>>> '  # an interactive session, as TensorFlow tells one\n"
        "from tfaccel import commands\n"
        "with commands.tensorflow_imported_quietly():\n"
        "    import tensorflow as tf\n"
        "print(tf.get_logger().level)\n"
        "tf.get_logger().setLevel('INFO')\n"
        "with commands.tensorflow_imported_quietly():\n"
        "    pass\n"
        "print(tf.get_logger().level)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["30", "20"]  # WARNING, then the user's INFO kept


@pytest.mark.serial  # a training measurement of 0.5 s, too short on a machine another test loads
def test_bench_sampler_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run(
        "bin/bench_sampler",
        "--seconds=0.5",
        "--layouts=1x2,2x2",
        "--inference_layouts=1x2",
        "--training_layouts=1x2",
        "--peer_envs=2",
        "--peers=ale_py_vector,gymnasium_async",  # the second needs OpenCV (the bench extra)
        f"--json={out}",
        f"--plot={png}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["game"] == "pong" and data["obs_shape"] == [104, 80, 4]
    assert data["raw_limit_sps"] == pytest.approx(data["raw_single_process_sps"] * data["cpus"])
    kinds = [(r["envs"], r["inference"]) for r in data["results"]]
    assert kinds == [
        (2, "none"),
        (4, "none"),
        (2, "synchronous"),
        (2, "alternating"),
        (2, "training"),
    ]
    assert 0 < data["summary"]["end_to_end_training_over_limit"] < 1
    assert all(r["sps"] > 0 for r in data["results"] + data["peers"])
    # A peer whose packages are not all installed is left out with a line, not a crash.
    opencv = importlib.util.find_spec("cv2") is not None
    assert [p["sampler"] for p in data["peers"]] == ["ale_py_vector"] + ["gymnasium_async"] * opencv
    assert opencv or "gymnasium_async: not installed (No module named 'cv2')" in result.stdout
    assert not [word for word in ("oneDNN", "cuInit", "cuda") if word in result.stderr], (
        result.stderr
    )
    assert data["git_revision"] and data["command"].startswith("bin/bench_sampler")
    assert data["machine"]["cpu"] and data["machine"]["cores"] >= 1  # the docs promise it
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "best_random_over_limit" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["bin/bench_sampler", "--game=pongg"],
            "unknown Atari game 'pongg'; closest valid names: pong",
        ),
        (["bin/bench_sampler", "--layouts=2by8"], "layout '2by8' is not WORKERSxENVS_PER_WORKER"),
        (["bin/bench_sampler", "--peers=rlpyt"], "unknown peers ['rlpyt']"),
        # each checked before the first measurement, not after minutes of them
        (["bin/bench_sampler", "--seconds=0"], "--seconds must be a positive number"),
        (["bin/bench_sampler", "--seconds=nan"], "--seconds must be a positive number"),
        (["bin/bench_sampler", "--tf_threads=-1"], "--tf_threads must be 0"),
        (["bin/bench_sampler", "--worker_niceness=50"], "--worker_niceness must be from 0 to 19"),
        (["bin/bench_sampler", "--layouts=0x4"], "--layouts: layout '0x4' needs at least 1"),
        (["bin/bench_sampler", "--layouts=1x3"], "into 2 alternating groups: give a multiple"),
        (["bin/bench_sampler", "--training_layouts=3x3"], "into 2 alternating groups: give a"),
        (["bin/bench_sampler", "--peer_envs=-8"], "--peer_envs '-8' is not a list of positive"),
        (["bin/bench_sampler", "--json=/nonexistent/b.json"], "the directory /nonexistent does"),
        (["bin/bench_sampler", "--plot=/nonexistent/b.png"], "the directory /nonexistent does"),
        (["bin/pool_demo", "--game=Pongg"], "unknown Atari game 'Pongg'"),
        (["bin/pool_demo", "--envs_per_worker=3"], "envs_per_worker (3) must split evenly"),
    ],
)
def test_user_errors_end_with_one_line(args, message):
    result = run(args[0], "--seconds=0.1", *args[1:], timeout=120)  # a flag given wins
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert "raw single process" not in result.stdout  # refused before any measurement


def test_pool_demo_runs_and_reports():
    result = run("bin/pool_demo", "--seconds=1", "--workers=2", "--envs_per_worker=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 pong envs in 2 workers" in result.stdout and "agent steps/s" in result.stdout


def test_pool_demo_ctrl_c_reports_what_ran_and_leaves_no_worker():
    process = subprocess.Popen(
        [sys.executable, "bin/pool_demo", "--seconds=600", "--workers=2", "--envs_per_worker=2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        assert "envs in 2 workers" in process.stdout.readline()  # the pool is stepping
        time.sleep(1.0)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err[-3000:]
    assert "agent steps/s" in out and "Traceback" not in err, (out, err[-3000:])
    assert re.fullmatch(r"stopped by SIGINT after [\d.]+ of 600 s", err.strip().splitlines()[-1])
    for _ in range(50):  # the forkserver notices its parent is gone within moments
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break  # no worker outlived the command
        time.sleep(0.1)
    else:
        pytest.fail("a process of pool_demo's group outlived it")
