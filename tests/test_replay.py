"""Tests of tfaccel.replay against slow references built from a plain log of the pool's steps."""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

from tfaccel import off_policy, replay
from tfaccel.envs.pool import SerialPool
from tfaccel.envs.toy import ScriptedConfig
from tfaccel.prefetch import Prefetcher
from tfaccel.replay import ReplayBuffer, SumTree

# Episodes of 4-6 steps (3 lives), games truncated at 9 steps: many ends of both kinds.
CONFIG = ScriptedConfig(
    height=4, width=3, stack=4, num_actions=3, life_length=4, lives=3, max_steps=9
)
B = 3


# ----------------------------------------------------------------------------- SumTree


def test_sum_tree_docstring_example():
    tree = SumTree(4)
    tree.update(np.array([0, 1, 2, 3, 3]), np.array([1.0, 2.0, 3.0, 9.0, 4.0]))
    assert tree.total() == 10.0
    values = np.array([0.0, 0.99, 1.0, 2.5, 3.0, 6.0, 9.99])
    assert tree.sample(values).tolist() == [0, 0, 1, 1, 2, 3, 3]
    assert tree.get(np.array([3, 0])).tolist() == [4.0, 1.0]


@pytest.mark.parametrize("capacity", [1, 5, 64, 100])
def test_sum_tree_matches_cumsum_reference(capacity):
    rng = np.random.default_rng(capacity)
    tree, reference = SumTree(capacity), np.zeros(capacity)
    for _ in range(20):
        indices = rng.integers(capacity, size=2 * capacity)  # repeats: the last write wins
        priorities = rng.uniform(0, 5, size=indices.size) * (rng.uniform(size=indices.size) > 0.2)
        tree.update(indices, priorities)
        for i, p in zip(indices, priorities, strict=True):
            reference[i] = p
        np.testing.assert_allclose(tree.total(), reference.sum())
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), reference)
        if reference.sum() == 0:
            continue
        values = rng.uniform(0, reference.sum(), size=200)
        expected = np.searchsorted(np.cumsum(reference), values, side="right")
        np.testing.assert_array_equal(tree.sample(values), expected)


# ----------------------------------------------------------------------------- driving a pool


def drive(buffer, steps, seed, pool_seed=0, log=None, check_at=(), after_step=None):
    """Steps a SerialPool of scripted envs with random actions, adding to `buffer` and the log.

    After the steps in `check_at`, compares the buffer with the log (`check_against_log`); calls
    `after_step(t)` after every step when given.
    """
    log = [] if log is None else log
    rng = np.random.default_rng(seed)
    with SerialPool(CONFIG, B, seed=pool_seed) as pool:
        observation = pool.reset().observation.copy()
        for t in range(steps):
            action = rng.integers(CONFIG.num_actions, size=B)
            step = pool.step(action)
            buffer.add(
                observation,
                action,
                step.reward,
                step.terminated,
                step.truncated,
                step.final_observation,
            )
            log.append(
                dict(
                    observation=observation,
                    action=action,
                    reward=step.reward.copy(),
                    terminated=step.terminated.copy(),
                    truncated=step.truncated.copy(),
                    final=step.final_observation.copy(),
                    cut=np.zeros(B, bool),
                )
            )
            observation = step.observation.copy()
            if t in check_at:
                check_against_log(buffer, log)
            if after_step is not None:
                after_step(t)
    log[-1]["cut"] = ~(log[-1]["terminated"] | log[-1]["truncated"])  # the stream ends here
    return log


def reference(log, buffer):
    """{index: (observation, action, return, discount, next_observation)} of valid transitions.

    Slow and obvious: walks the log env by env, step by step.
    """
    T, n, stack, gamma = buffer.time, buffer.n_step, buffer.stack, buffer.discount
    latest = len(log) - 1
    final_id, count = {}, 0
    for t, entry in enumerate(log):
        for b in range(B):
            if entry["truncated"][b] and not entry["terminated"][b]:
                final_id[t, b], count = count, count + 1
    expected = {}
    for b in range(B):
        start = [0]
        for t in range(1, len(log)):
            prev = log[t - 1]
            ended = prev["terminated"][b] or prev["truncated"][b] or prev["cut"][b]
            start.append(t if ended else start[-1])
        for u in range(max(0, latest - T + 1), latest + 1):
            if max(start[u], u - stack + 1) <= latest - T:
                continue  # an older frame of the stack was overwritten
            ret, target = 0.0, None
            for k in range(n):
                if u + k > latest:
                    break
                entry = log[u + k]
                ret += gamma**k * entry["reward"][b]
                if entry["terminated"][b]:
                    target = (ret, 0.0, entry["observation"][b])
                    break
                if entry["truncated"][b]:
                    if final_id[u + k, b] >= count - buffer.final_capacity:
                        target = (ret, gamma ** (k + 1), entry["final"][b])
                    break
                if entry["cut"][b]:
                    break
            else:
                if u + n <= latest:
                    target = (ret, gamma**n, log[u + n]["observation"][b])
            if target is not None:
                obs, action = log[u]["observation"][b], log[u]["action"][b]
                expected[u * B + b] = (obs, action, *target)  # step * B + env
    return expected


def check_against_log(buffer, log):
    expected = reference(log, buffer)
    assert sorted(expected) == sorted(buffer.indices().tolist())
    assert len(buffer) == len(expected)
    index = np.array(sorted(expected), np.int64)
    batch = buffer.get(index)
    for i, key in enumerate(index):
        obs, action, ret, discount, next_obs = expected[key]
        np.testing.assert_array_equal(batch.observation[i], obs)
        assert batch.action[i] == action
        np.testing.assert_allclose(batch.reward[i], ret, rtol=1e-6)
        np.testing.assert_allclose(batch.discount[i], discount, rtol=1e-6)
        np.testing.assert_array_equal(batch.next_observation[i], next_obs)
    return expected


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("truncation_capacity", [None, 2])
def test_rebuilt_stacks_and_n_step_targets_match_the_pool(n_step, truncation_capacity):
    buffer = ReplayBuffer(
        B,
        12 * B,
        (4, 3),
        stack=4,
        n_step=n_step,
        discount=0.9,
        truncation_capacity=truncation_capacity,
    )
    log = drive(buffer, 60, seed=1, check_at=(0, 3, 11, 12, 13, 25))  # before/at/after the wrap
    ends = {key: sum(int(entry[key].sum()) for entry in log) for key in ("terminated", "truncated")}
    assert ends["terminated"] > 5 and ends["truncated"] > 3
    expected = check_against_log(buffer, log)
    discounts = {round(float(v[3]), 6) for v in expected.values()}
    assert 0.0 in discounts and round(0.9**n_step, 6) in discounts
    if n_step == 3:  # a truncation within the window bootstraps with gamma^n' < gamma^n
        assert discounts & {0.9, 0.81}


def test_stacks_assembled_by_several_threads_match_the_pool():
    buffer = ReplayBuffer(
        B, 100 * B, (4, 3), n_step=3, discount=0.9, truncation_capacity=100, assembly_threads=3
    )
    log = drive(buffer, 150, seed=2)
    pool_calls = sum(replay._assembly_pool.cache_info()[:2])  # hits + misses
    expected = check_against_log(buffer, log)
    assert len(expected) >= 3 * replay._ROWS_PER_THREAD  # get() splits its rows in three
    assert sum(replay._assembly_pool.cache_info()[:2]) > pool_calls
    truncated = {i for i, v in expected.items() if v[3] > 0.9**3 + 1e-6}  # discount 0.9 or 0.81
    rows = sorted(expected)
    thirds = {rows.index(i) * 3 // len(rows) for i in truncated}
    assert thirds == {0, 1, 2}  # final frames replace the newest frame in every thread's rows
    with pytest.raises(ValueError, match="assembly_threads"):
        ReplayBuffer(B, 80 * B, (4, 3), assembly_threads=0)


def test_uniform_sample_draws_valid_transitions():
    buffer = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, seed=5)
    drive(buffer, 40, seed=0)
    batch = buffer.sample(500)
    valid = set(buffer.indices().tolist())
    assert set(batch.index.tolist()) == valid  # 500 draws cover the ~30 valid transitions
    np.testing.assert_array_equal(batch.weight, 1.0)
    again = buffer.get(batch.index)
    np.testing.assert_array_equal(again.next_observation, batch.next_observation)


def test_stacks_assembled_into_given_arrays_equal_new_ones():
    buffer = ReplayBuffer(B, 100 * B, (4, 3), n_step=3, truncation_capacity=100, seed=5)
    drive(buffer, 150, seed=2)
    index = buffer.sample(300).index
    whole = buffer.get(index)
    into = np.full((2, 400, 4, 3, 4), 7, np.uint8)  # a larger batch; rows 50..350 are these
    part = buffer.get(index, out=[into[0, 50:350], into[1, 50:350]])
    np.testing.assert_array_equal(into[0, 50:350], whole.observation)
    np.testing.assert_array_equal(into[1, 50:350], whole.next_observation)
    assert (
        part.observation.base is into and (into[:, :50] == 7).all() and (into[:, 350:] == 7).all()
    )
    with pytest.raises(ValueError, match=r"out is uint8 \(299, 4, 3, 4\)"):
        buffer.get(index, out=[into[0, :299], into[1, :299]])


def test_stream_restart_after_load_cuts_windows():
    buffer = ReplayBuffer(B, 20 * B, (4, 3), n_step=3, discount=0.9)
    log = drive(buffer, 13, seed=0)
    restored = ReplayBuffer(B, 20 * B, (4, 3), n_step=3, discount=0.9)
    restored.load_state_dict(buffer.state_dict())
    drive(restored, 9, seed=1, pool_seed=7, log=log)  # a fresh pool: every env starts anew
    check_against_log(restored, log)


def test_mid_episode_stream_start_skips_stacks_with_missing_history():
    buffer = ReplayBuffer(1, 40, (4, 3), stack=4, n_step=1)
    frames = np.arange(10, dtype=np.uint8)
    for t in range(6):  # observation t holds frames t..t+3 (no zeros: history unknown)
        obs = np.broadcast_to(frames[t : t + 4], (1, 4, 3, 4))
        buffer.add(obs, [0], [1.0], [False], [False], obs)
    # Transitions 0..2 need frames from before the stream; 3 and 4 are complete.
    assert buffer.indices().tolist() == [3, 4]
    batch = buffer.get(np.array([3, 4]))
    np.testing.assert_array_equal(batch.observation[:, 0, 0], [[3, 4, 5, 6], [4, 5, 6, 7]])
    np.testing.assert_array_equal(batch.next_observation[:, 0, 0], [[4, 5, 6, 7], [5, 6, 7, 8]])


# ----------------------------------------------------------------------------- priorities


def tiny_buffer(num_envs, steps, **kwargs):
    buffer = ReplayBuffer(num_envs, 8 * num_envs, (1, 1), stack=1, prioritized=True, **kwargs)
    for t in range(steps):
        obs = np.full((num_envs, 1, 1, 1), t, np.uint8)
        buffer.add(obs, np.zeros(num_envs), np.ones(num_envs), *[np.zeros(num_envs, bool)] * 2, obs)
    return buffer


def test_prioritized_frequencies_follow_priority_to_the_alpha():
    buffer = tiny_buffer(2, 5, alpha=0.5, seed=3)
    index = buffer.indices()  # steps 0..3 of 2 envs
    assert index.size == 8
    priorities = np.arange(1.0, 9.0)
    buffer.update_priorities(index, priorities)
    draws = np.concatenate([buffer.sample(1000).index for _ in range(40)])
    counts = np.array([(draws == i).sum() for i in index])
    expected = draws.size * priorities**0.5 / (priorities**0.5).sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 30.0  # 7 degrees of freedom: P(chi2 > 30) < 1e-4

    buffer.update_priorities(index[:1], [1000.0])  # sqrt: 31.6 against 15.3: P = 0.674
    draws = buffer.sample(4000).index
    assert 0.64 < (draws == index[0]).mean() < 0.71


def test_importance_weights_by_hand():
    buffer = tiny_buffer(1, 3, alpha=1.0)  # valid: steps 0 and 1
    index = buffer.indices()
    buffer.update_priorities(index, [1.0, 3.0])  # P = [1/4, 3/4]
    batch = buffer.sample(64, beta=0.5)
    # w = (N P)^-beta = (2/4)^-0.5 = 1.414 and (6/4)^-0.5 = 0.816; over the max: 1 and 1/sqrt(3).
    weight = {int(i): float(w) for i, w in zip(batch.index, batch.weight, strict=True)}
    assert weight == pytest.approx({int(index[0]): 1.0, int(index[1]): 3**-0.5})
    # A new transition gets the largest priority so far (3): P = 3/7.
    buffer.add(
        np.full((1, 1, 1, 1), 3, np.uint8),
        [0],
        [1.0],
        [False],
        [False],
        np.zeros((1, 1, 1, 1), np.uint8),
    )
    assert len(buffer) == 3
    batch = buffer.sample(7000)
    assert abs((batch.index == 2).mean() - 3 / 7) < 0.03


def test_weights_of_several_buffers_are_normalized_over_the_whole_batch():
    # Group 0 holds 2 transitions of priority 1 and 3, group 1 holds 4 of priority 1: drawn half
    # from each, a transition is picked with P_g(i) / 2 per draw against 1/6 for one buffer of
    # all six, so w = (6 * P_g(i) / 2)^-beta: (3/4)^-1, (9/4)^-1 and (3/4)^-1 with beta = 1.
    first, second = tiny_buffer(1, 3, alpha=1.0), tiny_buffer(2, 3, alpha=1.0)
    first.update_priorities(first.indices(), [1.0, 3.0])
    assert len(first) == 2 and len(second) == 4
    raw = first.sample(8, beta=1.0, normalize=False)  # (N_g * P_g(i))^-beta, not over the max
    expected = {int(first.indices()[0]): 2.0, int(first.indices()[1]): 2 / 3}
    assert dict(zip(raw.index.tolist(), raw.weight.tolist(), strict=True)) == pytest.approx(
        {int(i): expected[int(i)] for i in raw.index}
    )
    batch, shares = off_policy.sample_batch([first, second], 400, beta=1.0)
    assert shares == [200, 200] and batch.weight.max() == 1.0
    one = {int(first.indices()[0]): 1.0, int(first.indices()[1]): 1 / 3}
    np.testing.assert_allclose(batch.weight[:200], [one[int(i)] for i in batch.index[:200]])
    np.testing.assert_allclose(batch.weight[200:], 1.0)


def test_a_uniform_replay_loaded_into_a_prioritized_one_is_sampled_by_priority():
    uniform = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, seed=1)
    drive(uniform, 8, seed=0)  # the ring not yet full: empty slots at its end
    prioritized = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=True, seed=1)
    prioritized.load_state_dict(uniform.state_dict())
    batch = prioritized.sample(64, beta=0.5)  # the valid transitions get the max priority (1)
    assert set(batch.index.tolist()) <= set(uniform.indices().tolist())
    np.testing.assert_array_equal(batch.weight, 1.0)


def test_priority_floor():
    buffer = tiny_buffer(1, 3, alpha=1.0, epsilon=0.25)
    buffer.update_priorities(buffer.indices(), [0.0, 0.75])  # floored to 0.25: P = [1/4, 3/4]
    draws = buffer.sample(4000).index
    assert abs((draws == buffer.indices()[0]).mean() - 0.25) < 0.03


# ----------------------------------------------------------------------------- state


@pytest.mark.parametrize("prioritized, steps", [(False, 30), (True, 30), (True, 8)])
def test_state_dict_round_trip(prioritized, steps):
    buffer = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=prioritized, seed=1)
    drive(buffer, steps, seed=0)
    # The ring's rows are saved as far as they were written: 8 of 12, or all once wrapped.
    assert buffer.state_dict()["frames"].shape == (min(steps, 12), B, 4, 3)
    first = buffer.sample(16)
    buffer.update_priorities(first.index, np.arange(16.0))
    file = io.BytesIO()
    np.savez(file, **buffer.state_dict())
    file.seek(0)
    with np.load(file, allow_pickle=False) as saved:
        state = dict(saved)
    restored = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=prioritized, seed=99)
    drive(restored, 20, seed=5)  # what it held is replaced entirely
    restored.load_state_dict(state)
    for name, value in buffer.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[name], value, err_msg=name)
    assert len(restored) == len(buffer)
    for _ in range(3):
        a, b = buffer.sample(32, beta=0.6), restored.sample(32, beta=0.6)
        for name, x, y in zip(a._fields, a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)
    # Files written before (every row of the ring, used or not) still load.
    whole = dict(state, **{name: getattr(buffer, "_" + name) for name in ReplayBuffer._BY_STEP})
    del whole["time"]
    again = ReplayBuffer(B, 12 * B, (4, 3), n_step=3, prioritized=prioritized, seed=99)
    again.load_state_dict(whole)
    assert len(again) == len(buffer)
    other = ReplayBuffer(B, 16 * B, (4, 3), n_step=3, prioritized=prioritized)
    with pytest.raises(ValueError, match=r"keeps 12 steps of 3 envs .* this one keeps 16 steps"):
        other.load_state_dict(state)


def test_prefetcher_hands_over_batches_in_order_and_stops():
    counter = iter(range(1000))
    with Prefetcher(lambda: next(counter), depth=2) as prefetcher:
        assert [prefetcher.get() for _ in range(5)] == [0, 1, 2, 3, 4]
        thread = prefetcher._thread
    assert not thread.is_alive()


def test_prefetcher_raises_the_samplers_error_in_the_consumer():
    def broken():
        raise ValueError("the replay buffer holds no complete transition yet")

    with Prefetcher(broken) as prefetcher:
        with pytest.raises(ValueError, match="no complete transition"):
            prefetcher.get()


def test_prefetched_batches_stay_consistent_while_the_buffer_grows():
    # The thread samples while this thread adds steps: every batch must still be made of
    # transitions that were valid when drawn, i.e. equal to `get` on the frozen log.
    buffer = ReplayBuffer(B, 12 * B, (4, 3), n_step=2, prioritized=True, seed=3)
    batches, stop = [], threading.Event()
    with Prefetcher(lambda: buffer.sample(16) if len(buffer) else None) as prefetcher:

        def consume():
            while not stop.is_set():
                batch = prefetcher.get()
                if batch is not None:
                    batches.append(batch)
                    buffer.update_priorities(batch.index, np.ones(16))

        def pace(t):  # every 50 steps, wait for a batch drawn from the grown buffer
            if t % 50 == 49:
                taken, deadline = len(batches), time.monotonic() + 30
                while len(batches) == taken and time.monotonic() < deadline:
                    time.sleep(0.001)

        consumer = threading.Thread(target=consume)
        consumer.start()
        log = drive(buffer, 300, seed=1, after_step=pace)
        stop.set()
        consumer.join()
    assert len(batches) >= 6
    for batch in batches:
        assert batch.observation.shape == (16, 4, 3, 4) and np.all(batch.weight <= 1.0)
    check_against_log(buffer, log)


def test_a_priority_drawn_before_its_slot_was_written_again_stays_with_the_old_transition():
    buffer = ReplayBuffer(B, 12 * B, (4, 3), prioritized=True, seed=0)
    drive(buffer, 20, seed=0)
    drawn = np.unique(buffer.sample(256).index)  # a batch drawn ahead, as the prefetcher does
    drive(buffer, 6, seed=1)  # meanwhile the sampler writes 6 more steps over the oldest slots
    gone = drawn // B < 26 - 12  # steps no longer in the ring of 12
    assert gone.any() and (~gone).any()
    with pytest.raises(ValueError, match="no longer held"):
        buffer.get(drawn[gone])
    buffer.update_priorities(drawn, np.full(drawn.size, 100.0))  # stored as 100^0.5 = 10
    leaves = buffer._tree.get(drawn % (12 * B))  # their slots, now
    kept = np.isin(drawn, buffer.indices())  # held and still valid (the new stream cut some)
    assert (kept <= ~gone).all() and kept.any()
    np.testing.assert_allclose(leaves[kept], 10.0)
    # The new transitions in the slots of the gone ones keep their own priority (the largest
    # seen when they were added, 1), or 0 where not yet complete.
    assert set(np.round(leaves[gone], 6).tolist()) <= {0.0, 1.0}


def test_observations_whose_channels_are_not_a_frame_stack_are_refused_early():
    """A [H, W, 2] observation of a goal and an agent channel trained without a word and did
    not learn: the replay rebuilt its 'older frame' from the previous step's agent channel."""
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(2, 2 * 64, (3, 3), stack=2)
    goal = np.zeros((2, 3, 3), np.uint8)
    goal[:, 0, 0] = 255
    with pytest.raises(ValueError, match=r"the observations are not stacks of frames: in 62 of "
                       r"62 steps the older 1 channels"):  # fmt: skip
        for _ in range(32):
            agent = rng.integers(0, 2, (2, 3, 3), np.uint8) * 255
            observation = np.stack([goal, agent], axis=-1)  # [B, H, W, 2]: goal, agent
            nothing = np.zeros(2, bool)
            buffer.add(observation, np.zeros(2), np.zeros(2), nothing, nothing, observation)
