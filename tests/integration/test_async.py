"""Asynchronous runs through bin/train: two learner processes around the parameter store."""

import glob
import os

import pytest

from tests.integration.test_train import rows, train
from tfaccel.distribute.param_store import SHM_DIR


def stores_left():
    return glob.glob(os.path.join(SHM_DIR, "tfaccel-ps-*"))


def test_a3c_runs_resumes_and_leaves_no_store(tmp_path):
    before = set(stores_left())
    first = train(tmp_path, "--gin_file=a3c.gin", "--gin_file=smoke.gin",
                  "--gin_bindings=train.total_frames = 1000")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "learner-1" / "checkpoints" / "checkpoint").exists()
    assert (tmp_path / "policy" / "saved_model.pb").exists()
    assert not (tmp_path / "learner-1" / "policy").exists()  # only the chief exports
    done_first = int(rows(tmp_path)[-1]["env_frames"])
    assert done_first >= 1000
    second = train(tmp_path, "--gin_file=a3c.gin", "--gin_file=smoke.gin")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    frames = [int(row["env_frames"]) for row in rows(tmp_path)]
    assert frames == sorted(frames) and frames[-1] >= 2000  # the counter went on
    # both learners' steps count: the chief's own rows advance faster than its envs alone
    assert set(stores_left()) == before


@pytest.mark.parametrize("config", ["appo.gin"])
def test_appo_runs_with_smoke(tmp_path, config):
    result = train(tmp_path, f"--gin_file={config}", "--gin_file=smoke.gin",
                   "--gin_bindings=train.horizon = 16")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config_text = (tmp_path / "operative_config.gin").read_text()
    assert (
        "train_async.learners = 2" in config_text
        and "train.learning_rate = 6.25e-05" in config_text
    )
    assert (tmp_path / "policy" / "saved_model.pb").exists()


def test_a_failing_learner_ends_the_run_with_its_error(tmp_path):
    before = set(stores_left())
    result = train(tmp_path, "--gin_file=a3c.gin", "--gin_file=smoke.gin",
                   "--gin_bindings=train.num_groups = 3")  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: learner ") and "num_groups must be 1 or 2, got 3" in last, last
    assert set(stores_left()) == before
