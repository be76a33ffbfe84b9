"""Faults injected at named moments of real runs (tests/integration/faults.py): each run resumes
with at most one checkpoint interval lost, logs each frame once, and leaves no process, no
/dev/shm file and no partial file behind."""

import pytest

from tests.integration import faults
from tests.integration.commands import rows

# A2C on Pong at smoke scale, long enough to strike mid-run: a row every 400 frames, a checkpoint
# every 1,200.
A2C = (
    "--gin_file=a2c.gin", "--gin_file=smoke.gin",
    "--gin_bindings=RunConfig.total_frames = 4_000",
    "--gin_bindings=RunConfig.checkpoint_interval_frames = 1_200",
)  # fmt: skip
# DQN on Catch with its replay saved beside each checkpoint.
DQN = (
    "--gin_file=catch_dqn.gin",
    "--gin_bindings=train_off_policy.checkpoint_replay = True",
    "--gin_bindings=RunConfig.total_frames = 4_000",
    "--gin_bindings=RunConfig.checkpoint_interval_frames = 1_600",
    "--gin_bindings=RunConfig.log_interval_frames = 500",
)  # fmt: skip

FAULTS = {
    "trainer killed between checkpoints": faults.Fault(
        faults.frames_logged(2_000), "kill", A2C, 1_200
    ),
    "trainer killed as a checkpoint appears": faults.Fault(
        faults.file_appears("checkpoints/ckpt-*.index"), "kill", A2C, 1_200
    ),
    "process group killed as the policy is exported": faults.Fault(
        faults.file_appears("policy*"), "kill_group", A2C, 1_200
    ),
    "trainer killed as the replay is written": faults.Fault(
        faults.file_appears("checkpoints/replay-*"), "kill", DQN, 1_600
    ),
    "trainer stopped for 5 s (a starved machine)": faults.Fault(
        faults.frames_logged(1_200), "stop", A2C, 1_200
    ),
    "an env worker killed": faults.Fault(faults.frames_logged(800), "kill_worker", A2C, 1_200),
    "disk full at a checkpoint": faults.Fault(
        faults.frames_logged(0), "disk_full", A2C, 1_200, limit_mib=4
    ),
}


@pytest.mark.parametrize("name", FAULTS)
def test_a_run_struck_at_a_named_moment_resumes_whole(tmp_path, name):
    fault = FAULTS[name]
    struck = faults.strike(str(tmp_path), fault)
    if fault.blow in ("kill", "kill_group"):
        assert struck.returncode == -9, struck.stderr[-3000:]
    elif fault.blow == "disk_full":
        last = struck.stderr.strip().splitlines()[-1]
        assert struck.returncode == 1 and last.startswith("error: cannot write checkpoint"), last
        assert "is intact" in last
    else:  # survived: the run went on to its end
        assert struck.returncode == 0, struck.stderr[-3000:]
        if fault.blow == "kill_worker":
            assert int(rows(tmp_path)[-1]["worker_restarts"]) == 1
    faults.check_recovery(str(tmp_path), fault, struck, more_frames=800)
