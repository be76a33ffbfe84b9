"""tfaccel/policy_client.py on its own: its command line and its resize, number for number."""

import os
import subprocess
import sys

import ale_py
import numpy as np
import pytest
from ale_py import roms

from tfaccel import policy_client
from tfaccel.envs.frames import Resizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def client(*args):
    return subprocess.run(
        [sys.executable, "-m", "tfaccel.policy_client", "pretrained/a2c_pong", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--epsilon=7", "error: epsilon must be in [0, 1], got 7.0"),
        ("--epsilon=-0.5", "error: epsilon must be in [0, 1], got -0.5"),
        ("--episodes=0", "error: episodes must be >= 1, got 0"),
        ("--seed=-1", "error: seed must be >= 0, got -1"),
    ],
)
def test_a_setting_out_of_range_is_one_line_and_exit_1(flag, message):
    """--epsilon=7 and --episodes=0 were accepted, exit 0."""
    done = client(flag)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (1, [message], "")


def test_a_usage_error_stays_argparses():
    done = client("--episodes=many")
    assert done.returncode == 2 and "invalid int value: 'many'" in done.stderr


def test_area_weights_worked_example():
    np.testing.assert_array_equal(policy_client.area_weights(3, 2), [[2, 1, 0], [0, 1, 2]])
    np.testing.assert_array_equal(policy_client.area_weights(4, 2), [[2, 2, 0, 0], [0, 0, 2, 2]])
    assert (policy_client.area_weights(210, 84).sum(1) == 210).all()


def exact_area_mean(frame, height, width):
    """The mean of each output pixel's area as a fraction, rounded half up, in Python integers."""
    rows = policy_client.area_weights(frame.shape[0], height).tolist()
    cols = policy_client.area_weights(frame.shape[1], width).tolist()
    total = np.array(rows, object) @ frame.astype(object) @ np.array(cols, object).T
    area = frame.shape[0] * frame.shape[1]
    return ((2 * total + area) // (2 * area)).astype(np.uint8)


@pytest.mark.parametrize("in_shape, out_shape", [((210, 160), (84, 84)), ((250, 160), (84, 84)),
                                                 ((208, 160), (104, 80)), ((7, 5), (3, 2))])  # fmt: skip
def test_client_and_env_resize_to_the_exact_mean_rounded_half_up(in_shape, out_shape):
    """The float32 product rounded by floor(x + 0.5) gave the value below at many exact halves
    (a BLAS's order of sums decides), so no client in another language could match it."""
    frame = np.random.default_rng(0).integers(0, 256, in_shape, dtype=np.uint8)
    expected = exact_area_mean(frame, *out_shape)
    rows = policy_client.area_weights(in_shape[0], out_shape[0])
    cols = policy_client.area_weights(in_shape[1], out_shape[1]).T
    np.testing.assert_array_equal(policy_client.resize(frame, rows, cols), expected)
    resizer = Resizer(in_shape, out_shape)
    np.testing.assert_array_equal(resizer(frame), expected)
    resizer.halves = False  # the general path too
    np.testing.assert_array_equal(resizer(frame), expected)


def test_the_breakout_pixel_of_mean_60_5_is_61():
    """The audit's case: Breakout at 84x84, a pixel whose area's mean is 121 / 2 came out 60."""
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 0)
    ale.loadROM(roms.get_rom_path("breakout"))
    ale.reset_game()
    for step in range(19):
        ale.act(ale_py.Action.FIRE if step % 7 == 0 else ale_py.Action.RIGHT)
    screen = ale.getScreenGrayscale()  # [210, 160]
    total = policy_client.area_weights(210, 84) @ screen.astype(np.int64)
    total = total @ policy_client.area_weights(160, 84).T
    assert total[56, 32] * 2 == 121 * 210 * 160  # the mean is exactly 60.5 there
    rows, cols = policy_client.area_weights(210, 84), policy_client.area_weights(160, 84).T
    assert policy_client.resize(screen, rows, cols)[56, 32] == 61
    assert Resizer((210, 160), (84, 84))(screen)[56, 32] == 61
