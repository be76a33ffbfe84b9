"""benchmarks/compute_bound.py: each part of an agent step timed alone, from the trainer's own
settings as the configs bind them (toy configs here; the benchmark runs the Atari presets)."""

import os
import sys

import gin
import pytest

from tfaccel import gin_configs, off_policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import compute_bound  # noqa: E402


def test_a_trainers_arguments_are_its_bindings_over_its_defaults():
    gin_configs.parse(["toy/catch_dqn.gin"])
    args = compute_bound.arguments(off_policy.train_off_policy)
    assert args["batch_size"] == 64 and args["replay_ratio"] == 4.0  # bound by the config
    assert args["discount"] == 0.99 and args["dueling"] is False  # the trainer's defaults
    assert type(args["env"]).__name__ == "CatchConfig"  # references resolved


@pytest.mark.parametrize(
    "config, parts, names, group",
    [
        ("toy/catch_a2c.gin", compute_bound.on_policy_parts, ("inference", "learning"), 8),
        ("toy/catch_dqn.gin", lambda seconds: compute_bound.off_policy_parts(seconds, 2_000),
         ("inference", "replay", "learning"), 4),
    ],
)  # fmt: skip
def test_each_part_costs_some_cpu_per_agent_step(config, parts, names, group):
    gin_configs.parse([config])
    timed = parts(0.2)
    for name in names:
        assert 0 < timed[name] < 0.05, (name, timed[name])  # seconds per agent step
    assert timed["batch"] == group  # one group's envs: 16 or 8 envs in two groups
    if "updates_per_agent_step" in timed:
        assert timed["updates_per_agent_step"] == 4.0 / 64  # replay ratio / batch
    env = compute_bound.env_part(gin.get_bindings("train" if "a2c" in config else
                                                  "train_off_policy")["env"], 0.2)  # fmt: skip
    assert 0 < env < 0.01
