"""The env pool: equal to a serial loop, alternating groups, lifecycle, faults, no TensorFlow."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests import shm
from tests.fakes import as_from_a_terminal
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.pool import WORKER_NAME, EnvPool, PoolError, SerialPool, env_seeds
from tfaccel.envs.toy import ScriptedConfig
from tfaccel.types import ArraySpec, EnvSpec, check_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Alone, after the tests that share the machine (Makefile): these time a pool's start and look for
# pool workers and segments of the whole process group and /dev/shm.
pytestmark = pytest.mark.serial


def shm_segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith("tfaccel_")}


def worker_children():
    """Live (non-zombie) pool workers anywhere on the machine started from this process tree."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    name, rest = stat.read().split("(", 1)[1].rsplit(")", 1)
            except OSError:
                continue
            state, _parent, group = rest.split()[:3]
            # The group is read from the same stat line: a worker that exits between two
            # system calls cannot make this helper raise.
            if name.startswith(WORKER_NAME) and state != "Z" and int(group) == os.getpgid(0):
                found.append(int(entry))
    return found


def assert_steps_equal(a, b):
    for field in a._fields:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


@pytest.mark.parametrize(
    "num_groups, start_method", [(1, "forkserver"), (2, "forkserver"), (2, "spawn")]
)
def test_pool_equals_serial_loop_step_by_step(num_groups, start_method):
    config = ScriptedConfig(life_length=7, lives=4, max_steps=23)
    rng = np.random.default_rng(0)
    with (
        EnvPool(config, 2, 4, num_groups=num_groups, seed=11, start_method=start_method) as pool,
        SerialPool(config, 8, num_groups=num_groups, seed=11) as serial,
    ):
        assert pool.seeds == serial.seeds == env_seeds(11, 8)
        assert_steps_equal(pool.reset(), serial.reset())
        game_overs = terminations = truncations = 0
        for _ in range(60):
            actions = rng.integers(0, 3, 8)
            step = pool.step(actions)
            assert_steps_equal(step, serial.step(actions))
            game_overs += step.game_over.sum()
            terminations += step.terminated.sum()
            truncations += step.truncated.sum()
        assert game_overs and terminations and truncations  # every path was taken


def test_pool_matches_envs_stepped_by_hand_on_atari():
    config = AtariConfig(game="pong")
    with EnvPool(config, 2, 2, seed=5) as pool:
        envs = [config(seed) for seed in pool.seeds]
        np.testing.assert_array_equal(pool.reset().observation, np.stack([e.reset() for e in envs]))
        for t in range(40):
            actions = np.array([(t + i) % 6 for i in range(4)])
            step = pool.step(actions)
            for i, env in enumerate(envs):
                result = env.step(int(actions[i]))
                np.testing.assert_array_equal(step.observation[i], result.observation)
                assert step.reward[i] == result.reward


def test_alternating_groups_overlap_and_keep_order():
    config = ScriptedConfig(life_length=4)
    with (
        EnvPool(config, 2, 4, num_groups=2, seed=0) as pool,
        SerialPool(config, 8, num_groups=2, seed=0) as serial,
    ):
        pool.reset(), serial.reset()
        assert pool.group_size == 4
        for group in (0, 1):
            pool.send(np.zeros(4, np.int32), group)
            serial.send(np.zeros(4, np.int32), group)
        with pytest.raises(RuntimeError, match="out of order"):
            pool.recv(1)
        for t in range(20):
            group = t % 2
            assert_steps_equal(pool.recv(group), serial.recv(group))
            actions = np.full(4, t % 3, np.int32)
            pool.send(actions, group)
            serial.send(actions, group)
        with pytest.raises(RuntimeError, match="sent already"):
            pool.send(np.zeros(4, np.int32), 0)


def test_held_env_is_not_stepped():
    with SerialPool(ScriptedConfig(), 2) as serial, EnvPool(ScriptedConfig(), 1, 2) as pool:
        for p in (serial, pool):
            first = p.reset().observation.copy()
            step = p.step(np.array([-1, 1]))
            np.testing.assert_array_equal(step.observation[0], first[0])
            assert not np.array_equal(step.observation[1], first[1])
            assert step.reward[0] == 0.0


@pytest.mark.parametrize(
    "actions, message",
    [
        (np.zeros(3, np.int32), r"shape \(4,\)"),
        (np.full(4, 3), r"in \[0, 3\)"),
        (np.zeros(4), "integers"),
    ],
)
def test_bad_actions_are_named(actions, message):
    with EnvPool(ScriptedConfig(), 2, 2) as pool:
        pool.reset()
        with pytest.raises(ValueError, match=message):
            pool.send(actions)


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="must be positive"):
        EnvPool(ScriptedConfig(), 0, 2)
    with pytest.raises(ValueError, match="split evenly into 2 groups"):
        EnvPool(ScriptedConfig(), 2, 3, num_groups=2)


def test_close_is_idempotent_and_leaves_nothing():
    before = shm_segments()
    pool = EnvPool(ScriptedConfig(), 3, 2)
    assert shm.owner(pool._shm_path) == os.getpid()  # as tests/shm.py reads it for leak checks
    pool.reset()
    assert not shm_segments() - before  # the segment's name is gone once every worker mapped it
    assert sorted(pool.pids) == sorted(worker_children())
    pool.close()
    pool.close()
    assert not shm_segments() - before
    assert not worker_children()
    with pytest.raises(PoolError, match="closed"):
        pool.step(np.zeros(6, np.int32))


def test_exception_in_caller_closes_pool():
    before = shm_segments()
    with pytest.raises(KeyError):
        with EnvPool(ScriptedConfig(), 2, 2) as pool:
            pool.reset()
            raise KeyError("caller bug")
    assert not shm_segments() - before and not worker_children()


def test_env_exception_reaches_caller_with_worker_and_env():
    before = shm_segments()
    seeds = env_seeds(0, 4)
    config = ScriptedConfig(raise_at_step=3, faulty_seeds=(seeds[3],))
    with EnvPool(config, 2, 2, seed=0) as pool:
        pool.reset()
        pool.step(np.zeros(4, np.int32))
        pool.step(np.zeros(4, np.int32))
        with pytest.raises(
            PoolError,
            match=r"worker 1 .*envs \[2, 3\].*env 3 raised RuntimeError: scripted fault at step 3",
        ):
            pool.step(np.zeros(4, np.int32))
    assert not shm_segments() - before and not worker_children()


def test_killed_worker_is_reported_within_seconds():
    before = shm_segments()
    with EnvPool(ScriptedConfig(), 2, 2, timeout=60) as pool:
        pool.reset()
        os.kill(pool.pids[0], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PoolError, match=r"worker 0 .*(died|is gone).*SIGKILL"):
            pool.step(np.zeros(4, np.int32))
        assert time.monotonic() - start < 5
    assert not shm_segments() - before and not worker_children()


def test_worker_crash_inside_env_is_reported():
    with EnvPool(ScriptedConfig(crash_at_step=2), 2, 1) as pool:
        pool.reset()
        pool.step(np.zeros(2, np.int32))
        with pytest.raises(PoolError, match="died while stepping group 0 .killed by SIGKILL"):
            pool.step(np.zeros(2, np.int32))


def test_hung_worker_times_out():
    with EnvPool(ScriptedConfig(hang_at_step=1), 1, 1, timeout=1.0) as pool:
        pool.reset()
        start = time.monotonic()
        with pytest.raises(PoolError, match=r"did not answer within 1 s.*hung"):
            pool.step(np.zeros(1, np.int32))
        assert time.monotonic() - start < 10  # the 1 s timeout, then 2 s of grace before the kill
    assert not worker_children()


def step_twice_per_group(pool, rounds):
    """Alternates the two groups for `rounds` rounds; returns every group step's results."""
    results = []
    for _ in range(rounds):
        for group in (0, 1):
            step = pool.recv(group)
            results.append(
                (group, step.truncated.copy(), step.reward.copy(), step.game_over.copy())
            )
            pool.send(np.zeros(pool.group_size, np.int32), group)
    return results


def test_a_killed_worker_is_replaced_and_its_cut_episodes_are_marked():
    before = shm_segments()
    with EnvPool(ScriptedConfig(), 2, 2, num_groups=2, max_restarts=2) as pool:
        pool.reset()
        killed = pool.pids[0]
        os.kill(killed, signal.SIGKILL)  # dead before it owes anything: no race with its steps
        deadline = time.monotonic() + 10
        while killed in worker_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        for group in (0, 1):
            pool.send(np.zeros(2, np.int32), group)
        results = step_twice_per_group(pool, 20)
        (fault,) = pool.drain_faults()
        assert fault.startswith("worker 0 (pid") and "killed by SIGKILL" in fault
        assert "replaced by pid" in fault and pool.restarts == 1 and killed not in pool.pids
        # Worker 0 holds env 0 (group 0) and env 2 (group 1): the first step of each group
        # reports them cut (truncated, no reward, no game); worker 1's envs step normally.
        for group, truncated, reward, game_over in results[:2]:
            assert truncated.tolist() == [True, False], group
            assert reward[0] == 0.0 and not game_over[0]
        later = np.stack([truncated for _, truncated, _, _ in results[2:]])
        assert not later[:, 0].all()  # the replacement then plays on
        assert sorted(pool.pids) == sorted(worker_children())
        for group in (0, 1):
            pool.recv(group)
    assert not shm_segments() - before and not worker_children()


@pytest.mark.parametrize(
    "fault, message",
    [("raise_at_step", "raised RuntimeError: scripted fault"), ("hang_at_step", "hung?")],
    ids=["raise", "hang"],
)
def test_a_raising_or_hung_env_is_replaced_by_fresh_envs(fault, message):
    seeds = env_seeds(0, 4)
    config = ScriptedConfig(**{fault: 3}, faulty_seeds=(seeds[3],))
    with EnvPool(config, 2, 2, seed=0, max_restarts=1, timeout=2.0) as pool:
        pool.reset()
        for _ in range(10):
            step = pool.step(np.zeros(4, np.int32))
        (reported,) = pool.drain_faults()
        assert reported.startswith("worker 1 (pid") and message in reported
        assert pool.seeds[:2] == seeds[:2] and pool.seeds[2:] != seeds[2:]  # fresh seeds
        assert step.reward.shape == (4,)


def test_a_worker_failing_again_and_again_ends_with_a_clear_error():
    before = shm_segments()
    with pytest.raises(PoolError, match=r"died while stepping .*; 2 replaced within 600 s"):
        with EnvPool(ScriptedConfig(crash_at_step=2), 1, 2, max_restarts=2) as pool:
            pool.reset()
            for _ in range(10):
                pool.step(np.zeros(2, np.int32))
    assert not shm_segments() - before and not worker_children()


def test_a_hundred_start_and_stop_cycles_leak_nothing():
    before_shm, before_fds = shm_segments(), len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        with EnvPool(ScriptedConfig(), 1, 2, num_groups=2) as pool:
            pool.reset()
            pool.step(np.zeros(2, np.int32))
    assert not shm_segments() - before_shm and not worker_children()
    assert len(os.listdir("/proc/self/fd")) <= before_fds + 2  # the forkserver's, at most


def test_factory_failure_at_start_is_reported():
    with pytest.raises(PoolError, match="could not start"):
        EnvPool(BrokenFactory(), 1, 1)
    assert not worker_children()


class BrokenFactory:
    """Works in the caller (to read the spec), fails in workers."""

    def __call__(self, seed):
        if os.environ.get("TFACCEL_TEST_PARENT") != str(os.getpid()):
            raise OSError("no emulator here")
        return ScriptedConfig()(seed)


@pytest.fixture(autouse=True)
def _mark_parent(monkeypatch):
    monkeypatch.setenv("TFACCEL_TEST_PARENT", str(os.getpid()))


SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    {preamble}
    from tests.envs.probes import ModuleProbeConfig
    from tfaccel.envs.pool import EnvPool
    pool = EnvPool(ModuleProbeConfig("tensorflow"), 2, 2)
    pool.reset()
    print("tensorflow in workers:", pool.step(np.zeros(4, np.int32)).reward.tolist(), flush=True)
    print("pids", *pool.pids, flush=True)
    {body}
    """
)


def run_script(preamble="", body="", **kwargs):
    code = SCRIPT.format(preamble=preamble, body=body)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_workers_never_import_tensorflow_even_if_the_caller_did(tmp_path):
    path = tmp_path / "script_with_tf.py"  # spawned workers import the main script by its path
    script = "import tensorflow\nassert 'tensorflow' in sys.modules\n"
    path.write_text(SCRIPT.format(preamble=script, body=""))
    out = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert "tensorflow in workers: [0.0, 0.0, 0.0, 0.0]" in out.stdout, out.stderr[-2000:]


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_caller_interrupted_or_killed_leaves_no_workers_or_segments(how):
    before = shm_segments()
    # Python raises KeyboardInterrupt on SIGINT, unless it started with SIGINT ignored, as under
    # a shell's background job (`make test &`): then the script would sleep its 60 s out.
    process = run_script(
        preamble="import signal; signal.signal(signal.SIGINT, signal.default_int_handler)",
        body="time.sleep(60)",
    )
    lines = []
    while not lines or not lines[-1].startswith("pids"):
        lines.append(process.stdout.readline())
        assert lines[-1], process.stderr.read()
    pids = [int(p) for p in lines[-1].split()[1:]]
    os.kill(process.pid, signal.SIGINT if how == "sigint" else signal.SIGKILL)
    process.wait(90)  # seconds on an idle machine; generous for a loaded CI runner
    assert not wait_gone(pids)
    # Only new segments count: an earlier test's segment may still be on its way out.
    deadline = time.monotonic() + 10
    while shm_segments() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not shm_segments() - before


def test_thirty_two_env_atari_pool_starts_fast():
    start = time.monotonic()
    with EnvPool(AtariConfig(), 4, 8) as pool:
        pool.reset()
        elapsed = time.monotonic() - start
    # 2.2 s on an idle 2-core machine. Workers that imported TensorFlow (about 10 s each) or
    # started one after another would take well over 10 s.
    assert elapsed < 10.0, f"32-env pool took {elapsed:.1f} s to start"


def test_workers_can_be_pinned_and_niced():
    cpu = min(os.sched_getaffinity(0))  # one this process may use
    with EnvPool(ScriptedConfig(), 2, 1, cpu_affinity=[cpu], worker_niceness=3) as pool:
        pool.reset()
        for pid in pool.pids:
            assert os.sched_getaffinity(pid) == {cpu}
            assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 3


def test_groups_split_by_worker_equal_serial():
    config = ScriptedConfig(life_length=3)
    with (
        EnvPool(config, 2, 3, num_groups=2, split_groups_by_worker=True) as pool,
        SerialPool(config, 6, num_groups=2) as serial,
    ):
        assert_steps_equal(pool.reset(), serial.reset())
        for t in range(12):
            actions = np.full(6, t % 3)
            assert_steps_equal(pool.step(actions), serial.step(actions))


def test_factory_from_main_script_is_refused_with_a_reason():
    code = textwrap.dedent(
        """
        import dataclasses, sys
        from tfaccel.envs.pool import EnvPool
        from tfaccel.envs.toy import ScriptedConfig

        @dataclasses.dataclass(frozen=True)
        class MyConfig:
            def __call__(self, seed):
                return ScriptedConfig()(seed)

        def make(seed):
            return ScriptedConfig()(seed)

        for factory in (MyConfig(), make):
            try:
                EnvPool(factory, 1, 1)
            except ValueError as error:
                print("refused:", error)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.count("is defined in __main__, which pool workers do not import") == 2, (
        out.stderr
    )


def test_more_envs_than_shared_memory_holds_is_named_and_leaves_nothing():
    from tfaccel.envs.worker import Buffers

    config = ScriptedConfig(height=1000, width=1000)
    per_env = Buffers.plan(config(0).spec, 1)[1]
    stats = os.statvfs("/dev/shm")
    # More than the whole of /dev/shm: refused at once, without filling it on the way.
    too_many = stats.f_blocks * stats.f_frsize // per_env + 8
    before = shm_segments()
    with pytest.raises(ValueError, match=rf"{too_many} envs need .* MiB of shared memory and "):
        EnvPool(config, 1, too_many)
    assert not shm_segments() - before and not worker_children()


def test_a_worker_that_failed_before_its_next_command_is_reported_with_its_error():
    seeds = env_seeds(0, 2)  # one worker, env 0 in group 0 and env 1 in group 1
    config = ScriptedConfig(raise_at_step=1, faulty_seeds=(seeds[1],))
    with EnvPool(config, 1, 2, num_groups=2, seed=0, max_restarts=1) as pool:
        pool.reset()
        pool.send(np.zeros(1, np.int32), 0)
        pool.send(np.zeros(1, np.int32), 1)  # env 1 raises here, and the worker exits
        pool.recv(0)
        assert not wait_gone(pool.pids)
        pool.send(np.zeros(1, np.int32), 0)  # to a worker that is gone
        step_1, step_0 = pool.recv(1).truncated.copy(), pool.recv(0).truncated.copy()
        (fault,) = pool.drain_faults()
    assert "failed: " in fault and "env 1 raised RuntimeError: scripted fault at step 1" in fault
    assert step_1.tolist() == [True] and step_0.tolist() == [True]  # both cut by the fault


def test_segments_of_killed_pools_are_swept_and_live_ones_kept(tmp_path):
    """A pool killed while its workers start leaves its segment's name; the next pool removes
    those whose process is gone (and only those old enough not to be starting now)."""
    from tfaccel.envs.pool import remove_orphaned_segments

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(gone.stdout)
    names = {
        "orphan": f"tfaccel_{dead_pid}_0123456789",
        "live": f"tfaccel_{os.getpid()}_0123456789",
        "young": f"tfaccel_{dead_pid}_abcdef0123",
        "other": f"tfaccel_{dead_pid}_notours",
    }
    old = time.time() - 3600
    for key, name in names.items():
        (tmp_path / name).write_bytes(b"x")
        if key != "young":
            os.utime(tmp_path / name, (old, old))
    removed = remove_orphaned_segments(str(tmp_path), min_age=60.0)
    assert removed == [str(tmp_path / names["orphan"])]
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if k != "orphan")


BLOCKED_WHILE_STARTING = """
import multiprocessing, os, signal, threading, time
from tfaccel.envs.pool import signals_blocked_while_starting

def report(send):
    send.send(signal.pthread_sigmask(signal.SIG_BLOCK, []))

if __name__ == "__main__":
    caught = []
    signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()  # may take a signal
    receive, send = multiprocessing.get_context("spawn").Pipe(duplex=False)
    with signals_blocked_while_starting(signal.SIGINT):
        process = multiprocessing.get_context("spawn").Process(target=report, args=(send,))
        process.start()  # the first start of this process: the resource tracker starts too
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while it starts
        time.sleep(0.1)  # time for the other thread to take the signal
    time.sleep(0.2)
    print("child blocked SIGINT:", signal.SIGINT in receive.recv())
    print("parent caught SIGINT:", caught == [signal.SIGINT])
    process.join()
"""


def test_a_process_started_with_signals_blocked_holds_them_and_the_caller_keeps_its_own(
    tmp_path,
):
    # A child that started with SIGINT at its default would die of a Ctrl-C while it loads Python;
    # a caller that ignored SIGINT meanwhile (so that the child inherits the disposition) loses
    # the Ctrl-C whenever another of its threads takes it.
    path = tmp_path / "blocked.py"
    path.write_text(BLOCKED_WHILE_STARTING)
    out = subprocess.run(
        [sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT}, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    assert "child blocked SIGINT: True" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "parent caught SIGINT: True" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize(
    "spec",
    [
        {"observation": (4,), "num_actions": 2},  # not an EnvSpec: a 49-line AttributeError
        EnvSpec(ArraySpec((4,), np.float32), 0),  # no actions: Keras's "units=0" at the head
        EnvSpec(ArraySpec((0, 4), np.uint8), 2),
        EnvSpec(ArraySpec((4, 2.5), np.uint8), 2),
    ],
    ids=["dict", "no_actions", "empty_axis", "fractional_size"],
)
def test_a_malformed_env_spec_is_named_by_the_pool(spec):
    with pytest.raises(ValueError, match=r"an env's spec must be an EnvSpec\(ArraySpec\(shape, "
                       r"dtype\), num_actions >= 1\) from tfaccel.types, got "):  # fmt: skip
        check_spec(spec)
    check_spec(EnvSpec(ArraySpec((4,), np.float32), 2))  # as an env's should be


class _ReshapedEnv:
    """A scripted env (uint8 [4, 4, 1] frames) whose observations pass through `reshape`."""

    def __init__(self, seed, reshape):
        self.inner = ScriptedConfig(height=4, width=4, stack=1, life_length=3)(seed)
        self.spec, self.reshape = self.inner.spec, reshape

    def reset(self):
        return self.reshape(self.inner.reset())

    def step(self, action):
        result = self.inner.step(action)
        return result._replace(observation=self.reshape(result.observation))

    @property
    def game(self):
        return self.inner.game

    def close(self):
        self.inner.close()


@pytest.mark.parametrize(
    "reshape, problem",
    [
        (lambda o: o / 255.0, "dtype float64 and shape (4, 4, 1)"),  # would have been all 0 or 1
        (lambda o: o[..., 0], "dtype uint8 and shape (4, 4)"),
        (lambda o: np.uint8(7), "dtype uint8 and shape ()"),  # would have filled the row
        (lambda o: o.astype(np.uint16) + 256, "dtype uint16 and shape (4, 4, 1)"),  # 256 -> 0
        (lambda o: [[1], [1, 2]], "list that numpy cannot turn into uint8"),  # ragged
    ],
)
def test_an_observation_the_spec_does_not_describe_is_refused_not_cast(reshape, problem):
    pool = SerialPool(lambda seed: _ReshapedEnv(seed, reshape), 2)
    with pytest.raises(PoolError, match=rf"env 0 returned an observation of {re.escape(problem)}.*, "
                       r"but its spec says uint8 \(4, 4, 1\): return np.asarray"):  # fmt: skip
        pool.reset()


def test_an_observation_that_casts_without_loss_goes_in():
    as_ints = SerialPool(lambda seed: _ReshapedEnv(seed, lambda o: o.astype(np.int64)), 2)
    exact = SerialPool(lambda seed: _ReshapedEnv(seed, lambda o: o), 2)
    np.testing.assert_array_equal(as_ints.reset().observation, exact.reset().observation)
    for _ in range(5):  # through the end of a life and a reset inside step
        np.testing.assert_array_equal(
            as_ints.step(np.zeros(2, np.int32)).observation,
            exact.step(np.zeros(2, np.int32)).observation,
        )


@pytest.mark.parametrize("from_step, num_groups", [(0, 1), (2, 1), (2, 2)])
def test_an_env_that_breaks_its_spec_fails_the_pool_without_replacements(from_step, num_groups):
    """The pool replaced the worker first, whose fresh envs broke the spec again: the error came
    as "failed while resetting a replacement", or after three replacements. With two groups the
    worker has exited when the other group's step is sent: that must not replace it either."""
    from tests.envs.probes import FloatFramesConfig

    before = shm_segments()
    pool = EnvPool(FloatFramesConfig(from_step), 1, 2, num_groups=num_groups, max_restarts=3)
    with pool:
        with pytest.raises(PoolError) as error:
            pool.reset()
            for _ in range(3):
                for group in range(num_groups):
                    pool.send(np.zeros(pool.group_size, np.int32), group)
                    time.sleep(0.5)  # the worker fails on group 0 and exits before group 1 is sent
                for group in range(num_groups):
                    pool.recv(group)
        first = str(error.value).splitlines()[0]
        assert re.search(r"failed( while (resetting|stepping group 0))?: env 0 returned an "
                         r"observation of dtype float64", first), first  # fmt: skip
        assert "replace" not in first and pool.restarts == 0
    assert not shm_segments() - before and not worker_children()
