"""The same seed gives the same run as the committed golden files, row for row.

Seeded Catch runs of the three loops (A2C and PPO on the on-policy trainer, DQN on the
off-policy one, without prefetch: one fixed order of work) were recorded in tests/golden/. A
change that moves code around (a refactor) must leave them equal; a change that means to alter
the numbers (a new default, a fixed bug) writes them anew and says why in its commit:

    .venv/bin/python -m tests.integration.test_golden    # writes tests/golden/*.csv anew

Floats depend on the kernels a CPU runs: the runs pin TensorFlow to one code path (no oneDNN
graph rewrites, oneDNN's kernels at AVX2, two threads), and tests/golden/fingerprint.txt holds
what training steps of a small convolutional network and of the golden runs' own networks, at
their batch sizes, compute on that path. A machine where they come out otherwise (another
instruction set, or other cache sizes, by which the kernels block their sums) cannot reproduce
the files, and the test says so rather than compare. (A fingerprint of the small network alone
matched on two machines whose A2C runs differed from the first row.)
"""

import csv
import hashlib
import os
import subprocess
import sys

import pytest

from tests.integration.commands import ROOT, TIMING, rows, train

GOLDEN = os.path.join(ROOT, "tests", "golden")

# Each run: the trainer's gin name and the command-line arguments after --root_dir.
RUNS = {
    "catch_a2c": (
        "train",
        ["--gin_file=catch_a2c.gin", "--gin_bindings=RunConfig.total_frames = 12_000",
         "--gin_bindings=RunConfig.log_interval_frames = 2_000"],
    ),
    "catch_ppo": (
        "train",
        ["--gin_file=catch_ppo.gin", "--gin_bindings=RunConfig.total_frames = 12_000",
         "--gin_bindings=RunConfig.log_interval_frames = 2_000"],
    ),
    "catch_dqn": (
        "train_off_policy",
        ["--gin_file=catch_dqn.gin", "--gin_bindings=train_off_policy.prefetch = False",
         "--gin_bindings=RunConfig.total_frames = 4_000"],
    ),
}  # fmt: skip

# One code path for TensorFlow's float kernels, the same on every x86-64 CPU with AVX2.
PINNED = {"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "AVX2", "TF_CPP_MIN_LOG_LEVEL": "2"}

# A seeded training step of a small convolutional network, printed to the last bit.
NUMERICS = """
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([
    tf.keras.Input((20, 20, 4)), tf.keras.layers.Conv2D(8, 4, 2, activation="relu"),
    tf.keras.layers.Flatten(), tf.keras.layers.Dense(16, activation="relu"),
    tf.keras.layers.Dense(3)])
optimizer = tf.keras.optimizers.Adam(1e-3)
x = np.random.default_rng(0).random((32, 20, 20, 4), dtype=np.float32)
for _ in range(3):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
print(np.concatenate([v.numpy().ravel() for v in model.trainable_variables]).tobytes().hex())
# The golden runs' own networks at their batch sizes: how a CPU blocks a larger product (by its
# cache sizes) can change the sums where the small step above agrees.
import sys; sys.path.insert(0, ".")
import keras
from tfaccel.envs.toy import CatchConfig
from tfaccel.networks import PolicyValueNetwork, QNetwork, a3c_torso
spec = CatchConfig()(seed=0).spec
for make, batch in ((lambda: PolicyValueNetwork(spec, torso=a3c_torso), 40),
                    (lambda: PolicyValueNetwork(spec, torso=a3c_torso), 128),
                    (lambda: QNetwork(spec, torso=a3c_torso), 64)):
    keras.utils.set_random_seed(0)
    network, optimizer = make(), keras.optimizers.Adam(1e-3)
    x = np.random.default_rng(1).integers(0, 256, (batch, *spec.observation.shape), np.uint8)
    for _ in range(2):
        with tf.GradientTape() as tape:
            output = network(x)
            loss = sum(tf.reduce_mean(tf.square(o)) for o in tf.nest.flatten(output))
        optimizer.apply_gradients(zip(tape.gradient(loss, network.trainable_variables),
                                      network.trainable_variables))
    print(np.concatenate([v.numpy().ravel() for v in network.trainable_variables]).tobytes().hex())
"""


def pinned_env() -> dict:
    return {**os.environ, **PINNED}


def fingerprint() -> str:
    """A digest of what the small training step computes on this machine's pinned path."""
    result = subprocess.run(
        [sys.executable, "-c", NUMERICS], env=pinned_env(), capture_output=True, text=True,
        check=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    return hashlib.sha256(result.stdout.strip().encode()).hexdigest()[:16]


def learning_rows(run_dir) -> list[dict]:
    """The rows of a run's metrics.csv without the columns of time and memory."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows(run_dir)]


def run(root_dir, name):
    trainer, args = RUNS[name]
    result = train(
        root_dir, *args, "--gin_bindings=RunConfig.seed = 7",
        "--gin_bindings=RunConfig.tf_threads = 2", env=pinned_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return learning_rows(root_dir)


@pytest.fixture(scope="module")
def same_numerics():
    with open(os.path.join(GOLDEN, "fingerprint.txt")) as handle:
        recorded = handle.read().split()[0]
    here = fingerprint()
    if here != recorded:
        pytest.skip(
            f"this machine's float kernels give fingerprint {here}, the golden files were "
            f"recorded where they give {recorded}: it cannot reproduce them bit for bit"
        )


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_seeded_run_matches_its_golden_file_row_for_row(tmp_path, same_numerics, name):
    fresh = run(tmp_path, name)
    golden = learning_rows(os.path.join(GOLDEN, name))
    assert len(fresh) == len(golden) >= 2
    assert list(fresh[0]) == list(golden[0])  # the same columns, in the same order
    for number, (new, old) in enumerate(zip(fresh, golden, strict=True)):
        differ = {k: (old[k], new[k]) for k in old if new[k] != old[k]}
        assert not differ, f"row {number} (golden, fresh): {differ}"


def write_golden() -> None:
    """Records the golden runs and the fingerprint of this machine."""
    import tempfile

    os.makedirs(GOLDEN, exist_ok=True)
    for name in sorted(RUNS):
        with tempfile.TemporaryDirectory() as root_dir:
            table = run(root_dir, name)
        os.makedirs(os.path.join(GOLDEN, name), exist_ok=True)
        with open(os.path.join(GOLDEN, name, "metrics.csv"), "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(table)
        print(f"{name}: {len(table)} rows")
    with open(os.path.join(GOLDEN, "fingerprint.txt"), "w") as handle:
        handle.write(f"{fingerprint()}\n")


if __name__ == "__main__":
    write_golden()
