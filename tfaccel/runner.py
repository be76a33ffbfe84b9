"""The run skeleton both trainers share: the env pool, the frame offsets of a new run, and the
loop's bookkeeping (`Loop`): counters, recent scores, the stop vote, when to log, show progress
and save, the metrics row and the summary.

A trainer (`on_policy.train`, `off_policy.train_off_policy`) builds its learner and sampler, then
runs a body of its own inside this skeleton:

    loop = Loop(counters, frame_skip, settings, log, team, sampler, save)
    with StopRequest() as stop, saved_on(PoolError, loop.save_if_behind):
        while not loop.should_stop(stop):
            ...                                   # collect and learn (`loop.learn_seconds`)
            loop.advance(sampler.drain_games(), team.agent_steps(loop.base_steps, ...), metrics)
            loop.tick()                           # a metrics row, progress, a checkpoint
    return loop.finish(stop)

Counters are in agent steps and env frames (frames = agent steps x frame skip); periodic work fires
when at least its interval of frames has passed since it last fired.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import time

import gin
import numpy as np

from tfaccel import networks
from tfaccel.envs.pool import EnvPool, SerialPool
from tfaccel.logger import Progress
from tfaccel.types import check_field_ranges, check_field_types


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


def set_frame_offsets(models, env, seed: int, log, resumed: bool = False) -> None:
    """Measures the game's background for the networks' `FrameOffset` layers, if they have any,
    and says so; a resumed run keeps the offset its checkpoint holds (0 for a black game, or a run
    trained without one), measured and said once."""
    if resumed:
        return
    has_offset = any(
        isinstance(layer, networks.FrameOffset)
        for model in models
        for layer in getattr(getattr(model, "torso", None), "layers", [])
    )
    if has_offset:
        value = background_pixel(env, seed)
        if networks.set_frame_offsets(models, value):
            log.message(
                f"frames are offset by the game's background pixel, {value:.4f}"
                if value
                else "frames are not offset: the game's background is black"
            )


@gin.configurable(module="tfaccel")
@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The env pool of a training run, the same settings for every trainer (`PoolConfig.*`).

    Attributes:
        num_workers: env worker processes (0: the envs step in this process, see `make_pool`).
        envs_per_worker: envs per worker (with 0 workers: the envs).
        num_groups: 1 (synchronous) or 2 (alternating groups: one steps while the other's
            inference and learning run).
        worker_niceness: nice value added to env workers, so that inference and learning get
            the cores first.
        max_restarts: workers that die, hang or whose env raises are replaced up to this many
            times in `restart_window` seconds; one more fault ends the run (with its checkpoint).
        restart_window: seconds.
        timeout: seconds without an answer after which a worker is taken to hang.
    """

    num_workers: int = 2
    envs_per_worker: int = 8
    num_groups: int = 2
    worker_niceness: int = 5
    max_restarts: int = 3
    restart_window: float = 600.0
    timeout: float = 120.0

    def __post_init__(self):
        """Checks the layout when gin (or a caller) makes it, naming the binding to change."""
        check_field_types(self)  # None or '4' for a number is named, not a TypeError
        if self.num_workers < 0 or self.envs_per_worker <= 0:
            raise ValueError(
                "PoolConfig.num_workers must be 0 or more and PoolConfig.envs_per_worker 1 or "
                f"more, got {self.num_workers} and {self.envs_per_worker}"
            )
        if self.num_groups not in (1, 2):
            raise ValueError(f"PoolConfig.num_groups must be 1 or 2, got {self.num_groups}")
        # Nice values run from 0 to 19 above the trainer's; below it (negative) the workers
        # would take the cores from inference and learning, and need privileges to start.
        check_field_ranges(self, worker_niceness=(0, 19), max_restarts=(0, None))
        for name in ("restart_window", "timeout"):
            if not getattr(self, name) > 0:  # NaN too
                raise ValueError(
                    f"PoolConfig.{name} must be more than 0 seconds, got {getattr(self, name)!r}"
                )
        if self.envs_per_worker % self.num_groups:
            raise ValueError(
                f"PoolConfig.envs_per_worker ({self.envs_per_worker}) must split evenly into "
                f"PoolConfig.num_groups ({self.num_groups}) groups: give a multiple of "
                f"{self.num_groups}"
            )

    @property
    def group_size(self) -> int:
        """Envs per group (the batch of one inference call)."""
        return max(self.num_workers, 1) * self.envs_per_worker // max(self.num_groups, 1)


def make_pool(env, seed: int, layout: PoolConfig) -> EnvPool | SerialPool:
    """The env pool of a training run (`layout`). A worker that dies, hangs or whose env raises
    is replaced, up to `layout.max_restarts` times in `layout.restart_window` s; one more fault
    ends the run with its error (and the last checkpoint). See `EnvPool`.

    `num_workers = 0`: the `envs_per_worker` envs step in this process (`SerialPool`): slower,
    but an env defined in a notebook or a script's `__main__` works (workers cannot import it).
    """
    if layout.num_workers == 0:
        return SerialPool(env, layout.envs_per_worker, num_groups=layout.num_groups, seed=seed)
    check_pool_memory(layout.num_workers, layout.envs_per_worker)
    return EnvPool(
        env, layout.num_workers, layout.envs_per_worker, num_groups=layout.num_groups, seed=seed,
        worker_niceness=layout.worker_niceness, max_restarts=layout.max_restarts,
        restart_window=layout.restart_window, timeout=layout.timeout,
    )  # fmt: skip


# Resident memory of an env worker process of Atari envs (Python, numpy, ale-py) and of each
# more env in it, as measured on Pong: 46 MiB with 1 env, 59 with 16, 72 with 16 each in two
# workers; rounded up.
WORKER_MIB, ENV_MIB = 48, 1


def check_pool_memory(num_workers: int, envs_per_worker: int, available=None) -> None:
    """Raises a one-line ValueError when the workers would need more memory than the machine
    has available (MemAvailable): an oversized layout would otherwise end in the kernel's OOM
    kill of some process, with no word. `available`: bytes, for tests (default: this machine's)."""
    from tfaccel.replay import available_memory

    needed = (num_workers * WORKER_MIB + num_workers * envs_per_worker * ENV_MIB) * 2**20
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        raise ValueError(
            f"{num_workers:,} env workers of {envs_per_worker:,} envs need about "
            f"{needed / 2**30:.1f} GiB of memory and this machine has {available / 2**30:.1f} "
            "GiB available: use fewer workers (PoolConfig.num_workers) or envs per worker"
        )


@gin.configurable(module="tfaccel")
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How long a run trains, how often it logs, saves and evaluates, and what it does on its
    own: the settings every trainer shares (`RunConfig.*`; counts in env frames, which are agent
    steps x frame skip).

    Attributes:
        total_frames: env frames to train for. A run stops at the first update at or past it,
            so it may go over by up to one update's frames (PPO's 8 envs x 128 steps x frame
            skip 4: 4,096 frames); the intervals below fire the same way.
        log_interval_frames: env frames between rows of metrics.csv.
        checkpoint_interval_frames: env frames between checkpoints (each also exports the policy).
        eval_episodes: full games played by the exported policy at each checkpoint (Atari only;
            no life-loss ends, raw score, the noop starts of training; eval.csv); 0: none.
        max_wall_seconds: also stop (and save) after this much wall time in this process (0: no
            limit); the same command continues the run.
        seed: seeds the initial weights, the envs, the policy's sampling, the minibatches and
            replay sampling.
        on_nonfinite: after a step with a non-finite loss or gradient (never applied): `skip`,
            `restore` (the last checkpoint's weights) or `stop` (`guards.NonFiniteGuard`).
        tf_threads: TensorFlow's intra- and inter-op threads in this process (0: one per core).
    """

    total_frames: int = 10_000_000
    log_interval_frames: int = 100_000
    checkpoint_interval_frames: int = 1_000_000
    eval_episodes: int = 0
    max_wall_seconds: float = 0.0
    seed: int = 0
    on_nonfinite: str = "skip"
    tf_threads: int = 0

    def __post_init__(self):
        """Checks the counts when gin (or a caller) makes the settings, naming the binding."""
        check_field_types(self)  # None or '4' for a number is named, not a TypeError
        for name in ("total_frames", "log_interval_frames", "checkpoint_interval_frames"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"RunConfig.{name} must be a positive number of env frames, got "
                    f"{getattr(self, name)}"
                )
        for name in ("eval_episodes", "max_wall_seconds", "tf_threads", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"RunConfig.{name} must be 0 or more, got {getattr(self, name)}")


class Loop:
    """The bookkeeping of a training loop, the same for every trainer.

    It holds the frames reached (`frames`: every process's, counted by the team), the recent
    games' scores, and the seconds spent learning (`learn_seconds`, which the body adds to); it
    decides, with the team, when the run stops (`should_stop`), and after each step of the body
    (`tick`) writes a metrics row, refreshes the progress line and saves a checkpoint when their
    interval has passed. `finish` logs and saves what is left and returns the run's summary.

    Args:
        counters: the run's `checkpoint.Counters` (restored on resume).
        frame_skip: env frames per agent step.
        settings: the run's `RunConfig`.
        log: the run's `MetricsLogger`.
        team: the processes training together (`strategies.SyncTeam`, `AsyncTeam`).
        sampler: the trainer's sampler (its `pool`, its `seconds` of env and inference, and
            the `agent_steps` it took, which `finish` counts with the team's).
        save: `(frames, wall_s) -> None`, saves a checkpoint (and publishes the policy).
        columns: `() -> dict`, the trainer's own columns of a metrics row.
        note: `() -> str`, what the progress line adds after the score.
    """

    def __init__(self, counters, frame_skip, settings, log, team, sampler, save,
                 columns=dict, note=str):  # fmt: skip
        self.counters, self.frame_skip, self.settings = counters, frame_skip, settings
        self.log, self._team, self._sampler, self._save = log, team, sampler, save
        self._columns, self._note = columns, note
        self.base_steps, self.base_wall = int(counters.agent_steps), float(counters.wall_seconds)
        self.frames = self.last_log = self.last_save = self.base_steps * frame_skip
        # After a crash the checkpoint is later than the last row kept (rows and checkpoints
        # have their own intervals): the next row is due one interval after that row, else the
        # stretch between them would have none.
        kept = log.last_frames()
        if kept is not None:
            self.last_log = min(self.last_log, kept)
        self._rate_from = self.frames  # the frames that `fps` counts from (this process's)
        self.recent = collections.deque(counters.recalled_scores(), maxlen=counters.RECENT)
        self.start = self._last_time = time.perf_counter()
        self.learn_seconds = 0.0
        self.metrics: dict = {}
        self._display = Progress(
            log, settings.total_frames, frame_skip, self.frames, trained_seconds=self.base_wall
        )

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def complete(self) -> bool:
        """Whether the run had trained all its frames already (says so)."""
        if self.frames < self.settings.total_frames:
            return False
        self.log.message(
            f"the run is complete ({self.frames:,} frames); raise RunConfig.total_frames to go on"
        )
        return True

    def should_stop(self, stop) -> bool:
        """Whether the run stops now: all its frames are trained, a signal came (`stop`, a
        `StopRequest`) or its wall time is up, here or in any process of the team (all vote)."""
        return self._team.stop(
            self.frames >= self.settings.total_frames
            or stop.signal_name is not None
            or self._out_of_time()
        )

    def _out_of_time(self) -> bool:
        limit = self.settings.max_wall_seconds
        return bool(limit) and self.elapsed() >= limit

    def advance(self, games, steps: int, metrics: dict | None = None) -> None:
        """Counts the games that ended (`(score, length)` pairs) and the team's agent steps;
        `metrics`, the last update's (if the step made one), go into the next row."""
        if metrics is not None:
            self.metrics = metrics
        self.recent.extend(score for score, _ in games)
        self.counters.games.assign_add(len(games))
        self.frames = steps * self.frame_skip

    def tick(self) -> None:
        """After a step of the body: a metrics row, the progress line and a checkpoint, each when
        its interval has passed."""
        if self.frames - self.last_log >= self.settings.log_interval_frames:
            self.write_row()
        elif self._display.due():
            self._show()
        if self.frames - self.last_save >= self.settings.checkpoint_interval_frames:
            self.save()

    def score(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def write_row(self) -> None:
        now, elapsed = time.perf_counter(), self.elapsed()
        sampler = self._sampler
        self.log.write({
            "env_frames": self.frames,
            "agent_steps": self.frames // self.frame_skip,
            "wall_s": self.base_wall + elapsed,
            "fps": (self.frames - self._rate_from) / max(now - self._last_time, 1e-9),
            "episode_return_raw_mean": self.score(),
            "episodes": int(self.counters.games),
            "env_fraction": sampler.seconds["env"] / elapsed,
            "inference_fraction": sampler.seconds["inference"] / elapsed,
            "learn_fraction": self.learn_seconds / elapsed,
            "worker_restarts": sampler.pool.restarts,
            "peak_rss_mib": peak_rss_mib(),
            **self._columns(),
            **self.metrics,
        })  # fmt: skip
        self._show()
        self.last_log = self._rate_from = self.frames
        self._last_time = now

    def _show(self) -> None:
        elapsed = max(self.elapsed(), 1e-9)
        seconds = self._sampler.seconds
        split = (seconds["env"], seconds["inference"], self.learn_seconds)
        self._display.show(
            self.frames, self.score(), tuple(part / elapsed for part in split), self._note()
        )

    def save(self) -> None:
        """Saves a checkpoint at the frames reached, with the counters, wall time and scores."""
        wall_s = self.base_wall + self.elapsed()
        self.counters.agent_steps.assign(self.frames // self.frame_skip)
        self.counters.wall_seconds.assign(wall_s)
        self.counters.remember_scores(self.recent)
        self._save(self.frames, wall_s)
        self.last_save = self.frames

    def save_if_behind(self) -> None:
        """Saves unless the last checkpoint is at the frames reached (a run ended by a fault)."""
        if self.frames > self.last_save:
            self.save()

    def finish(self, stop) -> dict:
        """Logs and saves the frames not yet logged and saved, says why the run stopped, and
        returns its summary."""
        # Another process of the team may have added its last steps between this one's count
        # and the stop vote: the final row and checkpoint take them too (a resume would redo
        # them, and the last row would fall short of the total).
        steps = self._team.agent_steps(self.base_steps, self._sampler.agent_steps)
        self.frames = max(self.frames, steps * self.frame_skip)
        if self.frames > self.last_log:
            self.write_row()
        self.save_if_behind()
        self.log.end_progress()
        stopped_by = stop.signal_name
        if stopped_by is None and self.frames < self.settings.total_frames:
            # Not a signal here: this process's wall limit, or another process of the run
            # stopped (a signal or its own limit there) and all stop together.
            stopped_by = "max_wall_seconds" if self._out_of_time() else "another process"
        if stopped_by:
            cause = {
                "max_wall_seconds": "at the wall limit (RunConfig.max_wall_seconds = "
                f"{self.settings.max_wall_seconds:g})",
                "another process": "with another process of the run",
            }.get(stopped_by, f"by {stopped_by}")
            self._team.tell(
                self.log,
                f"stopped {cause} at {self.frames:,} frames; checkpoint saved: run the same "
                "command to resume",
            )
        return {
            "env_frames": self.frames,
            "final_score": self.score(),
            "wall_s": self.base_wall + self.elapsed(),
            "stopped_by": stopped_by,
            **self.metrics,
        }
