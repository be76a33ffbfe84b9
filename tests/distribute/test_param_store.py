"""tfaccel.distribute.param_store: chunked locks, no lost update, and the async Adam rule."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from tests import shm
from tfaccel.bench.memory import state
from tfaccel.distribute.param_store import AsyncAdam, ParameterStore


def quadratic(seed=0, size=37):
    """f(x) = 0.5 |A x - b|^2: gradient A^T (A x - b)."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(size, size)) / np.sqrt(size), rng.normal(size=size)
    return lambda x: (a.T @ (a @ x.astype(np.float64) - b)).astype(np.float32)


@pytest.mark.parametrize("steps", [1, 5])
def test_one_learner_follows_keras_adam(steps):
    import keras  # here, not above: the spawned learners below import this module
    import tensorflow as tf

    gradient = quadratic()
    start = np.random.default_rng(1).normal(size=37).astype(np.float32)
    store = ParameterStore.create(37, chunks=4)
    try:
        store.set(start)
        learner = AsyncAdam(37, learning_rate=0.01)
        for _ in range(100 // steps):
            learner.round(store, gradient, steps=steps)
        variable = tf.Variable(start)
        adam = keras.optimizers.Adam(learning_rate=0.01)
        for _ in range(100):
            adam.apply_gradients([(tf.constant(gradient(variable.numpy())), variable)])
        np.testing.assert_allclose(store.pull(), variable.numpy(), rtol=1e-6, atol=1e-6)
        assert store.pushes == 100 // steps
    finally:
        store.close()


def _push_ones(handle, seconds, counts, index):
    store = ParameterStore.attach(handle)
    ones = np.ones(store.size, np.float32)
    done, deadline = 0, time.time() + seconds
    while time.time() < deadline:
        store.push(ones)
        done += 1
    counts[index] = done
    store.close()


def test_concurrent_pushes_lose_no_update_and_pulls_see_whole_chunks():
    context = multiprocessing.get_context("spawn")
    store = ParameterStore.create(100_003, chunks=7)
    counts = context.Array("q", 4)
    try:
        learners = [
            context.Process(target=_push_ones, args=(store.handle(), 3.0, counts, i))
            for i in range(4)
        ]
        for learner in learners:
            learner.start()
        torn = 0
        while any(learner.is_alive() for learner in learners):
            params = store.pull()
            for start, stop in store.bounds:  # each chunk is read under its lock: all equal
                torn += int(params[start] != params[stop - 1])
        for learner in learners:
            learner.join()
            assert learner.exitcode == 0
        total = sum(counts)
        assert total > 40  # every learner pushed many times
        np.testing.assert_array_equal(store.pull(), np.full(100_003, total, np.float32))
        assert store.pushes == total and torn == 0
    finally:
        store.close()
    assert not os.path.exists(store.path)


def test_a_push_of_the_wrong_shape_is_named():
    store = ParameterStore.create(10)
    try:
        with pytest.raises(ValueError, match=r"expected float32 \[10\] parameters, got float64"):
            store.push(np.zeros(10))
    finally:
        store.close()


def test_a_store_is_told_apart_by_its_makers_pid_until_it_is_closed():
    store = ParameterStore.create(10)  # tests/shm.py reads its name for the leak checks
    try:
        assert shm.owner(store.path) == os.getpid()
        assert os.path.basename(store.path) in shm.left_by(os.getpid())
    finally:
        store.close()
    assert os.path.basename(store.path) not in shm.left_by(os.getpid())


def _hold(handle, chunk, signal_name):
    store = ParameterStore.attach(handle)
    assert store._locks.acquire(chunk, timeout=5)
    os.kill(os.getpid(), getattr(signal, signal_name))  # SIGKILL: dead; SIGSTOP: hung
    time.sleep(60)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_lock_of_a_killed_learner_is_free_and_one_of_a_hung_learner_is_named(signal_name):
    context = multiprocessing.get_context("spawn")
    store = ParameterStore.create(100, chunks=4)
    holder = context.Process(target=_hold, args=(store.handle(), 2, signal_name))
    try:
        holder.start()
        deadline = time.monotonic() + 60
        while state(holder.pid) not in ("T", "t") and holder.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.05)  # until it holds the lock and is dead or stopped
        store.lock_timeout = 0.5
        store.set_steps(5)  # other chunks' locks work either way
        started = time.monotonic()
        if signal_name == "SIGKILL":  # the kernel released its lock with its life
            assert store.pull().shape == (100,) and time.monotonic() - started < 0.5
        else:
            with pytest.raises(RuntimeError, match="a learner holding it is stopped or hung"):
                store.pull()
            assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.join()
        store.close()


def test_stores_in_one_process_exclude_each_others_threads_and_closing_one_keeps_the_other():
    store = ParameterStore.create(1000, chunks=2)
    other = ParameterStore.attach(store.handle())
    try:
        assert other._locks.acquire(0, timeout=1)
        assert not store._locks.acquire(0, timeout=0.05)  # the same file's lock, this process
        third = ParameterStore.attach(store.handle())
        third.close()  # keeps the shared descriptor, so the process's record lock stays
        other._locks.release(0)
        assert store._locks.acquire(0, timeout=1)
        store._locks.release(0)
    finally:
        other.close()
        store.close()


def test_stores_of_dead_launchers_are_swept_and_live_ones_kept(tmp_path):
    """A launcher SIGKILLed with its process group never unlinks its store: the next
    asynchronous run removes it (and only stores whose launcher is gone)."""
    import subprocess
    import sys

    from tfaccel import launcher

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead = f"tfaccel-ps-{ended.pid}-0a1b2c3d"
    live = f"tfaccel-ps-{os.getpid()}-0a1b2c3d"
    for name in (dead, live, "tfaccel-pool-123-x", "tfaccel-ps-notapid"):
        (tmp_path / name).write_bytes(b"store")
    assert launcher.sweep_dead_stores(str(tmp_path)) == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [live, "tfaccel-pool-123-x", "tfaccel-ps-notapid"]
    )
