"""Every name gin knows, registered in one place, and `run`, what `bin/train` runs.

Importing this module registers the trainers (`train`, `train_off_policy`, `train_async`), the
envs, the algorithms' configs, losses and act rules, the torsos and the optimizers; the config
files (gin_configs/) refer to them by these names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import gin

from tfaccel import (
    launcher,  # registers train_async
    learner,
    networks,
    off_policy,  # noqa: F401  (registers train_off_policy)
    on_policy,
    run_dir,
)
from tfaccel.algorithms import a2c, dqn, ppo
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.gymnasium_env import GymnasiumConfig
from tfaccel.envs.toy import CatchConfig, ScriptedConfig

for _configurable in (
    AtariConfig, CatchConfig, ScriptedConfig, GymnasiumConfig, a2c.A2CConfig, ppo.PPOConfig,
    dqn.DQNConfig,
):  # fmt: skip
    gin.external_configurable(_configurable, module="tfaccel")
gin.external_configurable(a2c.loss, "a2c_loss", module="tfaccel")
gin.external_configurable(a2c.act, "a2c_act", module="tfaccel")
gin.external_configurable(ppo.loss, "ppo_loss", module="tfaccel")
gin.external_configurable(ppo.samples, "ppo_samples", module="tfaccel")
for _function in (
    networks.a3c_torso,
    networks.nature_torso,
    networks.mlp_torso,
    learner.make_rmsprop,
    learner.make_adam,
):
    gin.external_configurable(_function, module="tfaccel")


@gin.configurable(denylist=["root_dir"])
def run(root_dir: str, trainer=None) -> dict:
    """What `bin/train` runs: `trainer(root_dir)`, on-policy `train` unless gin says otherwise
    (`run.trainer = @train_off_policy` for the DQN family). A run that fails before it trained
    anything leaves no directory it made (`run_dir.held`).

    Raises:
        ValueError: distribution configs that do not combine with the config's trainer
            (`check_distribution`).
    """
    trainer = trainer or on_policy.train
    check_distribution(trainer)
    return trainer(root_dir)


def check_distribution(trainer) -> None:
    """Refuses, in one line that says what works, the distribution configs (`distribute/`) a
    trainer would ignore or fail on deep in its learners.

    Raises:
        ValueError: async_machines.gin without asynchronous learners; async.gin with a DQN-family
            config, with multi_worker.gin or with mirrored.gin.
    """
    dqn_family = _bound("train_off_policy.algorithm") is not None
    if trainer is not launcher.train_async and _bound("train_async.sync_machines"):
        then = (
            "the DQN family has no asynchronous mode: use distribute/multi_worker.gin with it"
            if dqn_family
            else "put --gin_file=distribute/async.gin before it (a3c.gin and appo.gin include "
            "it), or use distribute/multi_worker.gin for synchronous training across machines"
        )
        raise ValueError(f"distribute/async_machines.gin works on asynchronous learners: {then}")
    if trainer is not launcher.train_async:
        return
    if dqn_family:
        raise ValueError(
            "distribute/async.gin runs on-policy learners (A2C, PPO): the DQN family has no "
            "asynchronous mode; use distribute/mirrored.gin or multi_worker.gin with it"
        )
    if _bound("make_strategy.kind") == "multi_worker":
        raise ValueError(
            "distribute/multi_worker.gin does not combine with asynchronous learners: for "
            "asynchronous learners on several machines use distribute/async_machines.gin"
        )
    if _bound("make_strategy.kind") == "mirrored":
        raise ValueError(
            "distribute/mirrored.gin does not combine with asynchronous learners: each learner "
            "trains on a device of its own (GPU i), so there is nothing to mirror; drop "
            "mirrored.gin, or drop async.gin for synchronous training on every local device"
        )


def trainers_run() -> tuple[str, ...]:
    """The trainers the parsed configs run: `(train_off_policy,)` for the DQN family,
    `(train_async, train)` for asynchronous learners (each runs `train`), else `(train,)`."""
    trainer = _bound("run.trainer")
    name = trainer.configurable.name if trainer is not None else "train"
    return ("train_async", "train") if name == "train_async" else (name,)


def idle_binding_warnings(bindings: Sequence[str]) -> list[str]:
    """A warning for each of `bindings` (a command line's) that sets a trainer the parsed
    configs do not run, e.g. `train_off_policy.batch_size = 64` under a2c.gin: gin takes it
    without a word (a config such as smoke.gin binds both trainers) and it changes nothing."""
    used, warnings = trainers_run(), []
    for binding in bindings:
        target = re.match(r"\s*([\w./]+)\.(\w+)\s*=", binding)
        name = target and target.group(1).rsplit("/", 1)[-1]
        if name in run_dir.TRAINERS and name not in used:
            family = "off-policy" if used[0] == "train_off_policy" else "on-policy"
            settings = " and ".join(f"{trainer}.*" for trainer in sorted(used))
            warnings.append(
                f"warning: {binding.strip()} changes nothing: this config trains with "
                f"{used[0]} ({family}); its settings are {settings}"
            )
    return warnings


def _bound(name: str):
    """The value bound to `name` (None where it is not bound)."""
    try:
        return gin.query_parameter(name)
    except ValueError:  # not bound
        return None
