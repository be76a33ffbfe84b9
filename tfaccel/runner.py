"""Builds a run from gin and runs it: collect -> train -> log / checkpoint / export, resumable.

`train(root_dir)` reads every setting from gin (configs in gin_configs/). Running it again on the
same `root_dir` resumes from the last checkpoint: network, optimizer slots and schedule position,
counters, wall time and the policy's random generator continue; `metrics.csv` is appended to.
The envs start new games on resume (emulator states are not checkpointed).

Counters are in agent steps and env frames (frames = agent steps x frame skip); periodic work fires
when at least its interval of frames has passed since it last fired.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import signal
import sys
import time
import tokenize

import gin
import numpy as np
from gin import config_parser

from tfaccel import checkpoint, console, evaluate, export, learner, networks
from tfaccel.algorithms import a2c, dqn, ppo
from tfaccel.distribute import strategies
from tfaccel.envs.atari import AtariConfig
from tfaccel.envs.gymnasium_env import GymnasiumConfig
from tfaccel.envs.pool import EnvPool, PoolError, SerialPool
from tfaccel.envs.toy import CatchConfig, ScriptedConfig
from tfaccel.logger import MetricsLogger, Progress
from tfaccel.sampler import OnPolicySampler, compile_act
from tfaccel.types import Rollout

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


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks, so a stop always saves first;
    `on_signal()`, if given, also runs at each signal (the asynchronous launcher forwards it).

    A process that must not die of a signal before its loop starts (a learner of an
    asynchronous run, stopped while it starts up) calls `StopRequest.hold_early()` first: a signal
    until then is kept, and the first `StopRequest` entered takes it over (the loop then saves
    after its first update and stops).
    """

    _early: str | None = None

    def __init__(self, on_signal=None):
        self.signal_name = None
        self._on_signal = on_signal
        self._previous = {}

    @classmethod
    def hold_early(cls) -> None:
        def keep(number, frame):
            cls._early = signal.Signals(number).name

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, keep)

    @classmethod
    def early_signal(cls) -> str | None:
        """The signal held since `hold_early`, if one came."""
        return cls._early

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        self.signal_name, StopRequest._early = StopRequest._early, None
        return self

    def _handle(self, number, frame):
        self.signal_name = signal.Signals(number).name
        if self._on_signal is not None:
            self._on_signal()

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def open_run(root_dir: str, team, precision: str) -> tuple[str, MetricsLogger, MetricsLogger]:
    """This process's run directory (created) and its metrics and eval loggers; only the chief
    of the processes training together shows progress. The log starts with the `precision`
    line (`networks.set_precision`), and a warning if this machine only emulates it."""
    run_dir = team.run_dir(root_dir)
    os.makedirs(run_dir, exist_ok=True)
    quiet = None if team.chief else open(os.devnull, "w")
    log = MetricsLogger(run_dir, stream=quiet)
    log.message(precision)
    if warning := networks.precision_warning():
        log.message(f"warning: {warning}")
    return run_dir, log, MetricsLogger(run_dir, "eval", stream=quiet)


def peak_rss_mib() -> float:
    """The trainer process's peak resident memory so far, in MiB (its replay, networks and
    TensorFlow; env workers are processes of their own)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def background_pixel(env, seed: int, steps: int = 100) -> float:
    """The most common pixel value, in [0, 1], of the newest frame of `steps` observations of
    random play in one env of `env` (a factory called with a seed): the game's background,
    which `networks.FrameOffset` subtracts (0 for a black one)."""
    game = env(seed)
    rng = np.random.default_rng(seed)
    observation, counts = game.reset(), np.zeros(256, np.int64)
    try:
        for _ in range(steps):
            counts += np.bincount(np.asarray(observation[..., -1]).ravel(), minlength=256)
            result = game.step(int(rng.integers(game.spec.num_actions)))
            ended = result.terminated or result.truncated
            observation = game.reset() if ended else result.observation
    finally:
        if hasattr(game, "close"):
            game.close()
    return float(np.argmax(counts)) / 255.0


def set_frame_offsets(models, env, seed: int, log) -> None:
    """Measures the game's background for the networks' `FrameOffset` layers, if they have any
    not yet set (a new run), and says so."""
    has_offset = any(
        isinstance(layer, networks.FrameOffset)
        for model in models
        for layer in getattr(getattr(model, "torso", None), "layers", [])
    )
    if has_offset:
        value = background_pixel(env, seed)
        if networks.set_frame_offsets(models, value):
            log.message(f"frames are offset by the game's background pixel, {value:.4f}")


def publish_policy(
    network, atari, root_dir: str, logs, frames: int, frame_skip: int, wall_s: float,
    eval_episodes: int, eval_epsilon: float, seed: int, **head,
) -> None:  # fmt: skip
    """Exports the policy to `root_dir/policy` and, for Atari with `eval_episodes`, plays that
    many full games with it and writes a row of eval.csv (`head`: see `export.export_policy`)."""
    log, eval_log = logs
    policy_dir = os.path.join(root_dir, "policy")
    export.export_policy(network, atari, policy_dir, extra={"env_frames": frames}, **head)
    if not (eval_episodes and atari):
        return
    scores = evaluate.evaluate(policy_dir, eval_episodes, epsilon=eval_epsilon, seed=seed)
    eval_log.write({
        "env_frames": frames, "agent_steps": frames // frame_skip, "wall_s": wall_s,
        "eval_return_mean": scores["mean"], "eval_return_std": scores["std"],
    })  # fmt: skip
    log.message(f"evaluation at {frames:,} frames: {scores['mean']:.1f}")


@gin.configurable(allowlist=["max_restarts", "restart_window", "timeout"])
def make_pool(
    env, num_workers: int, envs_per_worker: int, num_groups: int, seed: int, niceness: int,
    max_restarts: int = 3, restart_window: float = 600.0, timeout: float = 120.0,
) -> EnvPool | SerialPool:  # fmt: skip
    """The env pool of a training run. A worker that dies, hangs (no answer in `timeout` s) or
    whose env raises is replaced, up to `max_restarts` times in `restart_window` s; one more
    fault ends the run with its error (and the last checkpoint). See `EnvPool`.

    `num_workers = 0`: the `envs_per_worker` envs step in this process (`SerialPool`): slower,
    but an env defined in a notebook or a script's `__main__` works (workers cannot import it).
    """
    if num_workers == 0:
        return SerialPool(env, envs_per_worker, num_groups=num_groups, seed=seed)
    return EnvPool(
        env, num_workers, envs_per_worker, num_groups=num_groups, seed=seed,
        worker_niceness=niceness, max_restarts=max_restarts, restart_window=restart_window,
        timeout=timeout,
    )  # fmt: skip


@contextlib.contextmanager
def saved_on(error_type, save):
    """Calls `save` when the block raises `error_type` (the pool gave up on a worker: the
    learner's state is sound, so the run keeps its progress), then lets the error go on."""
    try:
        yield
    except error_type:
        save()
        raise


def report_faults(pool, log) -> None:
    """Says what went wrong with env workers since the last call (the pool replaced them)."""
    for fault in pool.drain_faults():
        log.message(f"warning: {fault}")


class _TextDelegate(config_parser.ParserDelegate):
    """Keeps references (`@name`, `@name()`) and macros (`%name`) of a gin file as text, so a
    file can be read without the configurables it names being registered."""

    def configurable_reference(self, scoped_name, evaluate):
        return f"@{scoped_name}()" if evaluate else f"@{scoped_name}"

    def macro(self, name):
        return f"%{name}"


def gin_settings(text: str) -> dict[str, object]:
    """The bindings of a gin file (e.g. an `operative_config.gin`) as `{"scope/name.arg": value}`."""
    settings = {}
    for statement in config_parser.ConfigParser(text, _TextDelegate()):
        if isinstance(statement, config_parser.BindingStatement):
            scope = f"{statement.scope}/" if statement.scope else ""
            settings[f"{scope}{statement.selector}.{statement.arg_name}"] = statement.value
    return settings


def changed_settings(before: str, after: str) -> list[str]:
    """What differs between two gin files, one `name: old -> new` per binding (`unset` where a
    file lacks it), sorted by name."""
    old, new = gin_settings(before), gin_settings(after)

    def shown(settings, name):
        return repr(settings[name]) if name in settings else "unset"

    return [
        f"{name}: {shown(old, name)} -> {shown(new, name)}"
        for name in sorted(old.keys() | new.keys())
        if name not in old or name not in new or old[name] != new[name]
    ]


def _note_changed_settings(config_path: str, config: str, frames: int, log) -> None:
    """Warns when `config` differs from the run's `operative_config.gin` at `config_path`, and
    then keeps that file as `operative_config.<frames>.gin` (see `resume`)."""
    with open(config_path) as handle:
        previous = handle.read()
    kept, again = os.path.join(os.path.dirname(config_path), f"operative_config.{frames}.gin"), 1
    while os.path.exists(kept):  # resumed at these frames before: keep that file as well
        again += 1
        kept = os.path.join(os.path.dirname(config_path), f"operative_config.{frames}-{again}.gin")
    try:
        changes = changed_settings(previous, config)
    except (SyntaxError, ValueError, tokenize.TokenError) as error:  # hand-edited or cut off
        os.replace(config_path, kept)
        log.message(f"warning: the run's previous settings ({kept}) are not readable gin: {error}")
        return
    if changes:
        os.replace(config_path, kept)
        log.message(
            f"warning: resumed with {len(changes)} setting(s) changed since the run last ran "
            f"(its settings then: {kept}): " + "; ".join(changes)
        )


# The settings that decide which variables a run's checkpoint holds: a run directory resumed
# with other values would fail to restore with a tensor-shape error deep in TensorFlow.
IDENTITY = (
    "run.trainer", "train.loss_fn", "train.torso", "train_off_policy.torso",
    "train_off_policy.dueling", "DQNConfig.num_atoms",
)  # fmt: skip


def check_same_algorithm(run_dir: str, config: str) -> None:
    """Raises a one-line ValueError when `run_dir` holds a run whose operative config differs
    from `config` in what decides its variables (`IDENTITY`: another algorithm or network)."""
    path = os.path.join(run_dir, "operative_config.gin")
    if not os.path.exists(path):
        return
    try:
        with open(path) as handle:
            before = gin_settings(handle.read())
    except (SyntaxError, ValueError, tokenize.TokenError):
        return  # unreadable: the restore and the settings warning say what they can
    after = gin_settings(config)

    def described(settings):
        return ", ".join(f"{name} = {settings[name]}" for name in IDENTITY if name in settings)

    if any(str(before.get(name)) != str(after.get(name)) for name in IDENTITY):
        raise ValueError(
            f"{run_dir} holds a run of another algorithm or network ({described(before)}) than "
            f"this command's ({described(after)}): give a new --root_dir, or resume it with the "
            f"configs it was started with (its settings: {path})"
        )


def resume(saver, run_dir: str, logs, counters, frame_skip: int, team) -> str | None:
    """Restores the latest checkpoint (if any; returns its path), writes the run's
    `operative_config.gin`, and rewinds metrics.csv and eval.csv to the restored frames, so the
    rows of work lost since that checkpoint are logged once, by the resumed run.

    A run resumed with other settings than it last ran with (a longer `total_frames`, another
    rate, or a network option that adds no variable, which the checkpoint cannot tell) goes on
    with the new ones, after a warning naming each change; the previous operative config is
    kept as `operative_config.<frames>.gin`."""
    config = gin.operative_config_str() + getattr(team, "operative_config", "")
    check_same_algorithm(run_dir, config)
    tick = time.perf_counter()
    restored = saver.restore()
    restore_seconds = time.perf_counter() - tick
    frames = int(counters.agent_steps) * frame_skip
    config_path = os.path.join(run_dir, "operative_config.gin")
    if restored and os.path.exists(config_path):
        _note_changed_settings(config_path, config, frames, logs[0])
    with open(config_path, "w") as handle:
        handle.write(config)
    for log in logs:
        log.rewind(frames)
    for path, reason in saver.skipped:
        logs[0].message(f"warning: skipped the unreadable checkpoint {path} ({reason})")
    if restored:
        logs[0].message(
            f"resumed from {restored} at {frames:,} frames (restored in {restore_seconds:.2f} s)"
        )
    return restored


class NonFiniteGuard:
    """What a run does after an SGD step whose loss or gradient was not finite (the learner
    never applies one; see `Learner.train`): it says where the value appeared and, by `action`:

    - `skip`: goes on with the next batch;
    - `restore`: reloads the weights and optimizer state of the last checkpoint (keeping the
      optimizer's step count: the learning rate's schedule goes on), then goes on; `team` then
      shares the restored weights (an asynchronous run's parameter store takes them);
    - `stop`: ends the run with that message (a `ValueError`); the last checkpoint stays.

    `check` replaces the update's `skipped_updates` by the count of this process so far.
    """

    ACTIONS = ("skip", "restore", "stop")

    @classmethod
    def check_action(cls, action: str) -> None:
        if action not in cls.ACTIONS:
            raise ValueError(f"on_nonfinite must be one of {cls.ACTIONS}, got {action!r}")

    def __init__(self, action: str, agent, saver, log, team=None):
        self.check_action(action)
        self.action, self._agent, self._saver, self._log = action, agent, saver, log
        self._team = team
        self.skipped = 0

    def check(self, metrics: dict, frames: int) -> None:
        count = int(metrics.get("skipped_updates", 0))
        self.skipped += count
        metrics["skipped_updates"] = self.skipped
        if not count:
            return
        where = getattr(self._agent, "last_fault", "") or "an update"
        text = f"a non-finite value in {where} at {frames:,} frames: {count} SGD step(s) skipped"
        if self.action == "stop":
            raise ValueError(
                f"{text}; stopping (on_nonfinite = 'stop'), the last checkpoint is intact"
            )
        if self.action == "restore":
            iterations = self._agent.optimizer.iterations
            steps = int(iterations)
            path = self._saver.restore_only("network", "target", "optimizer")
            iterations.assign(steps)
            if path and self._team is not None:
                self._team.after_restore(self._agent)
            text += f"; weights restored from {os.path.basename(path)}" if path else ""
        self._log.message(f"warning: {text}")


class DeadNetworkWatch:
    """Warns when the network's output stops depending on its input, from the spread over an
    update's batch (`value_std` of the A2C and PPO losses, `q_std` of the DQN loss):

    - dead: below `SPREAD` for `patience` updates in a row. The ReLU units of some layer are
      negative on every input (seen on Pong in A3C runs: every unit of the first convolution):
      no gradient reaches them again, so the run no longer learns, and resuming continues it.
    - nearly flat: below `WEAK` for `weak_frames` env frames in a row. A2C's critic on Breakout
      with centered frames stayed at a spread of about 0.005 (explained variance 0) for 10M
      frames and never learned; on Pong without an offset, where most first-layer channels died,
      it stayed under 0.02 for the first million frames. A learning critic's spread passes 0.1
      within a few hundred thousand frames (docs/notes/first-layers.md).
    """

    KEYS = ("value_std", "q_std")
    SPREAD = 1e-6
    WEAK = 0.01

    def __init__(self, log, patience: int = 50, weak_frames: int = 1_000_000):
        self._log, self._patience, self._weak_frames = log, patience, weak_frames
        self._run, self._since, self._weak_since = 0, 0, None
        self.warned = self.warned_weak = False

    def check(self, metrics: dict, frames: int) -> None:
        spread = next((metrics[key] for key in self.KEYS if key in metrics), None)
        if spread is None:
            return
        self._weak_since = (self._weak_since or frames) if spread < self.WEAK else None
        if (
            not self.warned_weak
            and self._weak_since is not None
            and frames - self._weak_since >= self._weak_frames
        ):
            self.warned_weak = True
            self._log.message(
                f"warning: the network's output has hardly depended on its input since "
                f"{self._weak_since:,} frames (a spread under {self.WEAK} over each batch): its "
                "first layers may be dead or saturated, and it may not learn; see "
                "docs/notes/first-layers.md"
            )
        if self.warned:
            return
        self._since = self._since if self._run else frames
        self._run = self._run + 1 if spread < self.SPREAD else 0
        if self._run >= self._patience:
            self.warned = True
            self._log.message(
                f"warning: the network's output has been the same for every observation of the "
                f"batch for {self._run} updates, since {self._since:,} frames: its ReLU units "
                "have died and it will not learn again (resuming continues it); stop the run and "
                "start it anew with a lower learning rate or another seed"
            )


@gin.configurable(denylist=["root_dir"])
def run(root_dir: str, trainer=None) -> dict:
    """What `bin/train` runs: `trainer(root_dir)`, on-policy `train` unless gin says otherwise
    (`run.trainer = @train_off_policy` for the DQN family)."""
    return (trainer or train)(root_dir)


@gin.configurable(denylist=["root_dir", "team"])
def train(
    root_dir: str,
    env=gin.REQUIRED,
    loss_fn=gin.REQUIRED,
    act_fn=gin.REQUIRED,
    algorithm=gin.REQUIRED,
    prepare_fn=None,
    anneal_clip: bool = False,
    torso=networks.a3c_torso,
    network=None,
    make_optimizer=learner.make_rmsprop,
    learning_rate: float = 7e-4,
    decay_learning_rate: bool = True,
    warmup_frames: int = 0,
    num_workers: int = 2,
    envs_per_worker: int = 16,
    num_groups: int = 2,
    horizon: int = 5,
    total_frames: int = 40_000_000,
    log_interval_frames: int = 100_000,
    checkpoint_interval_frames: int = 2_000_000,
    eval_episodes: int = 0,
    eval_epsilon: float = 0.0,
    max_wall_seconds: float = 0.0,
    worker_niceness: int = 5,
    tf_threads: int = 0,
    seed: int = 0,
    on_nonfinite: str = "skip",
    team=None,
) -> dict:
    """Trains an on-policy agent; see the module docstring. Returns the final summary.

    Args:
        root_dir: the run directory (created; reused to resume).
        env: env factory, e.g. `@AtariConfig()`.
        loss_fn: the algorithm's `loss(network, rollout, config)`, e.g. `@a2c_loss`.
        act_fn: the algorithm's act rule, e.g. `@a2c_act`.
        algorithm: the algorithm's hyperparameters, e.g. `@A2CConfig()`. Its `max_grad_norm`,
            `epochs` and `minibatches` (where it has them) drive the learner.
        prepare_fn: for several SGD steps per rollout, `(network, rollout, algorithm) -> samples`
            (`@ppo_samples`); None: one step on the whole rollout.
        anneal_clip: pass `clip = algorithm.clip x (current / initial learning rate)` to the loss
            (PPO's clip annealing, on the learning rate's schedule).
        torso: network torso factory (`@a3c_torso`, `@nature_torso`).
        network: `spec -> keras.Model` for a network of your own (it returns `(logits [B, A],
            value [B])` like `PolicyValueNetwork`); None: `PolicyValueNetwork` on `torso`.
        make_optimizer: `learning_rate -> optimizer` (`@make_rmsprop`, `@make_adam`).
        learning_rate: initial learning rate.
        decay_learning_rate: anneal it linearly to 0 over `total_frames`.
        warmup_frames: raise it linearly from 0 over this many env frames first (0: none; see
            `learner.warm_up`); a decay still runs over all of `total_frames`.
        num_workers: env worker processes (0: the envs step in this process, see `make_pool`).
        envs_per_worker: envs per worker (with 0 workers: the envs).
        num_groups: 1 (synchronous) or 2 (alternating groups, each trained on as it completes).
        horizon: steps per rollout (t_max).
        total_frames: env frames to train for (frames = agent steps x frame skip).
        log_interval_frames: env frames between rows of metrics.csv.
        checkpoint_interval_frames: env frames between checkpoints (each also exports the policy).
        eval_episodes: full games played by the exported policy at each checkpoint (Atari only;
            no life-loss ends, raw score, the noop starts of training); 0: no evaluation.
        eval_epsilon: epsilon-greedy exploration of those games.
        max_wall_seconds: also stop (and save) after this much wall time in this process (0: no
            limit); the same command continues the run.
        worker_niceness: nice value added to env workers so inference and learning get the cores.
        tf_threads: TensorFlow's intra- and inter-op threads in this process (0: one per core).
        seed: seeds the initial weights, the envs, the policy's sampling and the minibatches.
        on_nonfinite: after a step with a non-finite loss or gradient (never applied): `skip`,
            `restore` (the last checkpoint's weights) or `stop` (see `NonFiniteGuard`).
        team: the processes training together, when not this process alone or the workers of
            the strategy (`tfaccel.distribute.asynchronous.AsyncTeam`; not a gin setting).
    """
    NonFiniteGuard.check_action(on_nonfinite)  # before anything starts
    strategy = console.set_up_tensorflow(tf_threads, strategies.make_strategy)
    precision = networks.set_precision()  # gin: set_precision.policy
    group_size = max(num_workers, 1) * envs_per_worker // max(num_groups, 1)  # 0: in process
    strategies.check_split(strategy, group_size, "the number of envs per group")
    _check_rollout(horizon, group_size // strategies.local_replicas(strategy), algorithm)
    # Several processes (multi-worker or asynchronous learners): each runs this on its own envs;
    # the chief owns root_dir, the others keep their state in their own directory below it.
    team = team or strategies.SyncTeam(strategy)
    learners, chief, seed = team.learners, team.chief, team.seed(seed)
    run_dir, log, eval_log = open_run(root_dir, team, precision)
    frame_skip = getattr(env, "frame_skip", 1)
    with make_pool(env, num_workers, envs_per_worker, num_groups, seed, worker_niceness) as pool:
        # The schedule counts optimizer steps: PPO takes epochs x minibatches of them per rollout.
        frames_per_rollout = frame_skip * horizon * pool.group_size * learners
        steps_per_rollout = getattr(algorithm, "epochs", 1) * getattr(algorithm, "minibatches", 1)
        decay = (
            learner.linear_decay(
                learning_rate, -(-total_frames // frames_per_rollout) * steps_per_rollout
            )  # over every rollout the run takes, the last one part-way too
            if decay_learning_rate
            else None
        )
        warmup_steps = warmup_frames // frames_per_rollout * steps_per_rollout
        schedule = learner.warm_up(decay or float(learning_rate), warmup_steps)

        def algorithm_loss(network, batch):
            if not anneal_clip:
                return loss_fn(network, batch, algorithm)
            # 1 -> 0 with the decay (not the warm-up): the clip starts at its full value
            progress = decay(agent.optimizer.iterations) / learning_rate if decay else 1.0
            return loss_fn(network, batch, algorithm, clip=algorithm.clip * progress)

        agent = learner.Learner(
            lambda: (network or functools.partial(networks.PolicyValueNetwork, torso=torso))(
                pool.spec
            ),
            algorithm_loss,
            lambda: make_optimizer(schedule),
            max_grad_norm=getattr(algorithm, "max_grad_norm", 0.0),
            prepare_fn=prepare_fn
            and (lambda network, batch: prepare_fn(network, batch, algorithm)),
            epochs=getattr(algorithm, "epochs", 1),
            minibatches=getattr(algorithm, "minibatches", 1),
            seed=seed,
            strategy=strategy,
            batch_axes=Rollout.env_axes(),
        )
        act, value, generator = compile_act(agent.network, act_fn, pool.spec, pool.group_size, seed)
        counters = checkpoint.Counters()
        saver = checkpoint.Checkpointer(
            os.path.join(run_dir, "checkpoints"),
            network=agent.network, optimizer=agent.optimizer, counters=counters,
            generator=generator, learner_generator=agent.generator,
        )  # fmt: skip
        resume(saver, run_dir, (log, eval_log), counters, frame_skip, team)
        set_frame_offsets([agent.network], env, seed, log)
        agent = team.attach(agent, counters)
        sampler = OnPolicySampler(pool, act, value, horizon)
        atari = env if isinstance(env, AtariConfig) else None

        def save(frames: int, wall_s: float) -> None:
            team.before_save(agent)
            saver.save(frames)
            if chief:
                publish_policy(
                    agent.network, atari, root_dir, (log, eval_log), frames, frame_skip, wall_s,
                    eval_episodes, eval_epsilon, seed,
                )  # fmt: skip

        limits = (total_frames, max_wall_seconds, log_interval_frames, checkpoint_interval_frames)
        guard = NonFiniteGuard(on_nonfinite, agent, saver, log, team)
        return _loop(sampler, agent, counters, save, log, frame_skip, limits, team, guard)


def _check_rollout(horizon: int, samples_per_step: int, algorithm) -> None:
    """Raises a one-line ValueError for a rollout the learner cannot use whole."""
    epochs, minibatches = getattr(algorithm, "epochs", 1), getattr(algorithm, "minibatches", 1)
    for name, value in (("horizon", horizon), ("epochs", epochs), ("minibatches", minibatches)):
        if value < 1:
            raise ValueError(f"{name} is {value}; it must be 1 or more")
    samples = horizon * samples_per_step
    if samples % minibatches:
        raise ValueError(
            f"a rollout of {samples} samples per replica (horizon {horizon} x {samples_per_step} "
            f"envs) does not split into {minibatches} minibatches: make it a multiple of "
            f"{minibatches}"
        )


def _loop(sampler, agent, counters, save, log, frame_skip, limits, team, guard):
    """The run itself, top to bottom: collect, train, report, save; stop on time or on a signal.

    `team` counts the agent steps of every process training together and makes them stop
    together (`team.stop(flag)` is True on all of them once any of them asks).
    """
    total_frames, max_wall_seconds, log_every, save_every = limits
    base_steps, base_wall = int(counters.agent_steps), float(counters.wall_seconds)
    start = time.perf_counter()
    recent = collections.deque(counters.recalled_scores(), maxlen=counters.RECENT)
    learn_seconds, metrics = 0.0, {}
    last = {
        "log": base_steps * frame_skip,
        "save": base_steps * frame_skip,
        "time": start,
        "steps": base_steps,
    }
    frames = base_steps * frame_skip
    if frames >= total_frames:
        log.message(f"the run is complete ({frames:,} frames); raise train.total_frames to go on")
        return {
            "env_frames": frames,
            "final_score": float("nan"),
            "wall_s": base_wall,
            "stopped_by": None,
        }

    display = Progress(log, total_frames, frame_skip, frames)
    log.message(
        f"training on {sampler.pool.num_envs} envs, {total_frames - frames:,} frames to go "
        f"(from {frames:,}); learning from the first rollout"
    )

    def save_now() -> None:
        counters.agent_steps.assign(frames // frame_skip)
        counters.wall_seconds.assign(base_wall + time.perf_counter() - start)
        counters.remember_scores(recent)
        save(frames, base_wall + time.perf_counter() - start)
        last["save"] = frames

    watch = DeadNetworkWatch(log)
    with StopRequest() as stop, saved_on(PoolError, lambda: frames > last["save"] and save_now()):
        for _, rollout in sampler.rollouts():
            tick = time.perf_counter()
            metrics = agent.train(rollout)
            learn_seconds += time.perf_counter() - tick
            report_faults(sampler.pool, log)
            games = sampler.drain_games()
            recent.extend(score for score, _ in games)
            counters.games.assign_add(len(games))
            counters.updates.assign_add(1)
            steps = team.agent_steps(base_steps, sampler.agent_steps)  # every process's
            frames = steps * frame_skip
            guard.check(metrics, frames)
            watch.check(metrics, frames)
            out_of_time = max_wall_seconds and time.perf_counter() - start >= max_wall_seconds
            done = team.stop(frames >= total_frames or stop.signal_name is not None or out_of_time)
            logged = frames - last["log"] >= log_every or done
            if logged:
                now = time.perf_counter()
                fps = (steps - last["steps"]) * frame_skip / max(now - last["time"], 1e-9)
                elapsed = now - start
                row = {
                    "env_frames": frames,
                    "agent_steps": frames // frame_skip,
                    "wall_s": base_wall + elapsed,
                    "fps": fps,
                    "episode_return_raw_mean": float(np.mean(recent)) if recent else float("nan"),
                    "episodes": int(counters.games),
                    "learning_rate": agent.learning_rate,
                    "env_fraction": sampler.seconds["env"] / elapsed,
                    "inference_fraction": sampler.seconds["inference"] / elapsed,
                    "learn_fraction": learn_seconds / elapsed,
                    "worker_restarts": sampler.pool.restarts,
                    "peak_rss_mib": peak_rss_mib(),
                    **metrics,
                }
                log.write(row)
                last.update(log=frames, time=now, steps=steps)
            if logged or display.due():
                elapsed = time.perf_counter() - start
                split = (sampler.seconds["env"], sampler.seconds["inference"], learn_seconds)
                score = float(np.mean(recent)) if recent else float("nan")
                display.show(frames, score, tuple(part / elapsed for part in split))
            if frames - last["save"] >= save_every or done:
                save_now()
            if done:
                break
    log.end_progress()
    if stop.signal_name:
        log.message(
            f"stopped by {stop.signal_name} at {frames:,} frames; checkpoint saved: run the same command to resume"
        )
    return {
        "env_frames": frames,
        "final_score": float(np.mean(recent)) if recent else float("nan"),
        "wall_s": base_wall + time.perf_counter() - start,
        "stopped_by": stop.signal_name,
        **metrics,
    }
