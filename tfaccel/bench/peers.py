"""The samplers a user would otherwise pick, stepped with random actions on the same game.

Each `*_sps` function returns agent steps per second summed over all envs, measured after a
warm-up, or raises ImportError when the peer is not installed (the caller leaves it out).
Observations are 104x80 with 4 stacked frames wherever the peer allows it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np

from tfaccel import console


def timed(step: Callable[[], int], seconds: float, warmup: float = 1.0) -> float:
    """Calls `step` (which returns how many agent steps it took) for `seconds` after `warmup`."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        step()
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    return steps / elapsed


def random_steps(config) -> Callable[[], int]:
    """A call that steps one env of `config` (an env factory) once with a random action,
    starting a new game when one ends; it returns 1 (the agent steps it took)."""
    env = config(seed=0)
    env.reset()
    actions = np.random.default_rng(0).integers(0, env.spec.num_actions, 1 << 16)
    counter = [0]

    def step():
        counter[0] += 1
        result = env.step(int(actions[counter[0] & 0xFFFF]))
        if result.terminated or result.truncated:
            env.reset()
        return 1

    return step


def raw_single_process_sps(config, seconds: float) -> float:
    """The limit's measure: one env of `config` (an `AtariConfig`) in this process, random
    actions, the same preprocessing as training; its steps per second."""
    return timed(random_steps(config), seconds)


def gymnasium_async_sps(game: str, num_envs: int, seconds: float) -> float:
    """gymnasium AsyncVectorEnv over AtariPreprocessing + FrameStackObservation (a pipe per env)."""
    import ale_py
    import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV, part of the bench extra)
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env_id = "ALE/" + "".join(part.capitalize() for part in game.split("_")) + "-v5"

    def make():
        env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
        return FrameStackObservation(AtariPreprocessing(env, screen_size=(80, 104)), 4)

    return _random_actions_sps(gym.vector.AsyncVectorEnv([make] * num_envs), seconds)


def ale_vector_sps(game: str, num_envs: int, seconds: float) -> float:
    """ale-py's AtariVectorEnv: C++ threads, preprocessing in C++ (resize with OpenCV)."""
    from ale_py.vector_env import AtariVectorEnv

    envs = AtariVectorEnv(game=game, num_envs=num_envs, img_height=104, img_width=80, stack_num=4)
    return _random_actions_sps(envs, seconds)


def _random_actions_sps(envs, seconds: float) -> float:
    """Steps a gymnasium vector env with random actions; closes it."""
    try:
        envs.reset(seed=0)
        rng = np.random.default_rng(0)
        num_envs, n = envs.num_envs, envs.single_action_space.n

        def step():
            envs.step(rng.integers(0, n, num_envs))
            return num_envs

        return timed(step, seconds)
    finally:
        envs.close()


def tf_agents_parallel_sps(game: str, num_envs: int, seconds: float) -> float:
    """tf-agents ParallelPyEnvironment (a process and a pipe per env) over tfaccel's Atari env."""
    with console.stderr_silenced():  # tf-agents' imports print C++ start-up lines and gym's notice
        from tfaccel.bench import tf_agents_peer  # raises ImportError without tf-agents

        # isort: split
        from tf_agents.environments import parallel_py_environment
        from tf_agents.system import system_multiprocessing

    with contextlib.suppress(ValueError):  # ValueError: its context was set up already
        system_multiprocessing.enable_interactive_mode()
    constructors = [tf_agents_peer.constructor(game, seed) for seed in range(num_envs)]
    envs = parallel_py_environment.ParallelPyEnvironment(constructors, start_serially=False)
    try:
        envs.reset()
        rng = np.random.default_rng(0)
        n = int(envs.action_spec().maximum) + 1

        def step():
            envs.step(rng.integers(0, n, num_envs).astype(np.int32))
            return num_envs

        return timed(step, seconds)
    finally:
        envs.close()


PEERS = {
    "gymnasium_async": gymnasium_async_sps,
    "ale_py_vector": ale_vector_sps,
    "tf_agents_parallel": tf_agents_parallel_sps,
}
