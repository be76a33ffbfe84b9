"""The asynchronous run's launcher: K sampler-learner processes around one parameter store.

`train_async(root_dir)` (gin: `run.trainer = @train_async`) starts the learners as spawned
processes, each running the on-policy `on_policy.train` with an `AsyncTeam`
(`tfaccel.distribute.asynchronous`). Learner 0 (the chief) creates the store from its (restored
or fresh) network and writes the run directory; learner i keeps its own checkpoints and log in
`<root_dir>/learner-<i>`. Frames count every learner's envs (a shared counter in the store); any
learner's stop (frame budget, signal, wall time) stops all. A3C (BA3C-style batched) is `a2c.gin`
run this way (`gin_configs/a3c.gin`), APPO is PPO with the paper's changes for asynchrony
(`gin_configs/appo.gin`).

The launcher forwards stop signals, watches the learners (one that fails stops the others, which
save first) and removes the store at the end. Several machines
(`train_async.sync_machines = True`, `gin_configs/distribute/async_machines.gin`): each machine
runs this with its own store, and the launchers average the stores in rounds
(`tfaccel.distribute.machines`); machine m > 0 writes to `<root_dir>/machine-<m>`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import signal
import sys
import threading
import time
from multiprocessing import connection

import gin
import tensorflow as tf

from tfaccel import console, gin_configs, networks, run_dir
from tfaccel.commands import first_line
from tfaccel.distribute import machines, strategies
from tfaccel.distribute.asynchronous import ORPHANED, AsyncTeam
from tfaccel.distribute.param_store import ParameterStore
from tfaccel.envs.pool import PoolError, exit_reason, signals_blocked_while_starting
from tfaccel.envs.worker import SHM_DIR
from tfaccel.guards import StopRequest


class LearnerFailed(RuntimeError):
    """A learner process of an asynchronous run ended with an error (the message says which)."""


def _stop_when_orphaned(parent: int) -> None:
    """SIGTERM to this learner once its launcher is gone (killed): it saves a checkpoint and
    exits instead of training on alone."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        ORPHANED.set()  # the chief then removes the store, which the launcher would have
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="tfaccel-orphan-watch", daemon=True).start()


def learner_gpus(learners: int, visible: int, cuda_visible: str | None) -> list[dict]:
    """The environment each learner starts with: GPU i modulo the `visible` GPUs, named as the
    user's `CUDA_VISIBLE_DEVICES` names them (its i-th entry; the i-th GPU without it); when
    learners share a GPU, each allocates its memory as it grows (else the first takes it all)."""
    if not visible:
        return [{} for _ in range(learners)]
    names = cuda_visible.split(",") if cuda_visible else [str(i) for i in range(visible)]
    shared = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"} if learners > visible else {}
    return [
        {"CUDA_VISIBLE_DEVICES": names[index % visible].strip(), **shared}
        for index in range(learners)
    ]


def _learner_main(config: str, root_dir: str, team_args: tuple, results, environment: dict):
    """A learner process: trains the on-policy config with an `AsyncTeam`; sends its summary
    (or its error) to the launcher on `results` (the sending end of a pipe of its own)."""
    StopRequest.hold_early()  # stopped while it starts: it saves after its first update
    _stop_when_orphaned(os.getppid())
    run_dir.launcher_pid = os.getppid()  # a second command on the directory names the launcher
    os.environ.update(environment)
    from tfaccel import on_policy, trainers  # noqa: F401  (trainers registers every configurable)

    gin.parse_config(config)
    team = AsyncTeam(*team_args)
    try:
        summary = on_policy.train(root_dir, team=team)
    except Exception as error:  # the launcher names it in one line
        if StopRequest.early_signal():  # stopped while it started (an env worker that
            return  # the same Ctrl-C ended, say): it had not trained, there is nothing to say
        if isinstance(error, RuntimeError):  # no algorithm's config: say which to give
            error = gin_configs.no_algorithm(error) or error
        # A setting is rejected before the learner joins the store (it builds and restores
        # first); one that fails there fails again, and resuming is no advice.
        setting = isinstance(error, ValueError) and team.store is None
        env = isinstance(error, PoolError)
        with contextlib.suppress(OSError):  # a launcher killed meanwhile: nobody to tell
            results.send({"error": first_line(error)[:1000], "setting": setting, "env": env})
        if isinstance(error, (ValueError, OSError, PoolError)):  # said in full by that line
            sys.exit(1)
        raise  # anything else: its traceback goes to stderr too
    finally:
        team.close()
    with contextlib.suppress(OSError):
        results.send(summary)


@gin.configurable(denylist=["root_dir"], module="tfaccel")
def train_async(
    root_dir: str, learners: int = 2, steps_per_push: int = 1, chunks: int = 16,
    sync_machines: bool = False, sync_period_seconds: float = 2.0,
) -> dict:  # fmt: skip
    """Runs `learners` asynchronous sampler-learners of the on-policy config; see the module doc.

    Args:
        root_dir: the run directory (created; reused to resume).
        learners: K, learner processes, each with the config's envs and its own device (GPU i
            modulo the GPUs, or the CPU).
        steps_per_push: n, local updates between a learner's pull and its push.
        chunks: locks of the parameter store (pushes to different chunks do not wait).
        sync_machines: this machine is one of several (the cluster of `make_strategy`:
            `TF_CONFIG` or Slurm) whose stores are averaged every `sync_period_seconds`.
        sync_period_seconds: seconds between the machines' rounds.

    Returns:
        The chief learner's summary (with `sync_rounds` and `parameters_digest` across machines).

    Raises:
        LearnerFailed: a learner failed (the others are stopped and save a checkpoint first).
    """
    if learners < 1 or steps_per_push < 1 or chunks < 1:
        raise ValueError(
            f"train_async needs learners, steps_per_push and chunks >= 1, got {learners}, "
            f"{steps_per_push}, {chunks}"
        )
    if sync_period_seconds <= 0:
        raise ValueError(f"sync_period_seconds must be > 0, got {sync_period_seconds}")
    strategy = None
    if sync_machines:  # before TF's devices, without their start-up lines (a CUDA probe's)
        strategy = console.set_up_tensorflow(make_strategy=machines.collective_strategy)
    machine, machine_count = 0, 1
    if strategy is not None:
        machine, machine_count = strategies.worker_index(strategy), strategies.num_workers(strategy)
        root_dir = root_dir if machine == 0 else os.path.join(root_dir, f"machine-{machine}")
    # Pipes, file locks and a file: nothing of multiprocessing's named semaphores (Lock, Event,
    # Queue), which a SIGKILL of the whole process group would leave in /dev/shm for good.
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(learners)]  # (receive, send) each
    sweep_dead_stores()
    name = f"{STORE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    with console.stderr_silenced():  # TensorFlow's CUDA probe prints its failure on a CPU host
        gpus = len(tf.config.list_physical_devices("GPU"))
    if strategy is not None and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        gpus = min(gpus, strategies.node_gpus())  # Slurm's resolver named the task's share
    # Measured once here, so that the learners choose one precision alike (`set_precision`).
    measured = networks.speedup_for_children(gpus)
    environments = [
        {**environment, **measured}
        for environment in learner_gpus(learners, gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    ]
    config, operative = gin.config_str(), gin.operative_config_str()
    shared = (learners, steps_per_push, name, chunks, operative, machine, machine_count)
    processes = [
        context.Process(  # started through console: no TensorFlow start-up lines
            target=console.call_quietly,
            args=(
                __name__,
                "_learner_main",
                config,
                root_dir,
                (index, *shared),
                pipes[index][1],
                environments[index],
            ),  # fmt: skip
            name=f"tfaccel-learner{index}",
        )
        for index in range(learners)
    ]
    # Ctrl-C or a SIGTERM to the launcher alone: the learners save and exit, the launcher waits for
    # them and cleans up (killed by SIGTERM's default action, it would leave that to the learners'
    # orphan watch and to multiprocessing's resource tracker). A signal while they start: the
    # rest are not started, and the started ones are told (one may have missed the forward).
    # A run that fails before it trained leaves no directory behind: each learner removes the
    # one it made, and this process root_dir, which a learner may still have held then.
    started, made = [], not os.path.exists(root_dir)
    try:
        with StopRequest(on_signal=lambda number: _terminate(started, number)) as stop:
            _start(processes, started, stop)
            for _, send in pipes:  # the learners hold theirs: one that ends unsent reads as EOF
                send.close()
            failed, sync = _supervise(started, strategy, (name, chunks), sync_period_seconds)
        return _outcome(stop, failed, _drain([receive for receive, _ in pipes]), sync)
    except BaseException:
        if made:
            run_dir.remove_if_unused(root_dir)
        raise
    finally:
        _unlink(name)
        _unlink(f"{name}-new")  # a chief that ended before it published the store


def _start(processes, started: list, stop) -> None:
    """Starts `processes` one by one into `started`, unless a stop signal comes first (then the
    ones started are told to stop)."""
    for process in processes:
        if stop.signal_name:
            break
        # A Ctrl-C reaches the whole process group: a learner still loading Python would die of
        # it with a KeyboardInterrupt traceback. It starts with SIGINT blocked instead, and takes
        # a pending one up as a stop when its handler is set (`StopRequest.hold_early`).
        with signals_blocked_while_starting(signal.SIGINT):
            process.start()
        started.append(process)
    if stop.signal_name:
        _terminate(started)


def _supervise(processes, strategy, store_args, sync_period_seconds):
    """Waits for the learners to end (with several machines, syncing this machine's store with
    the others' meanwhile); returns the first failure, `(index, exit code)` or None, and the
    machines' `MachineSync` (None: one machine, or no round taken)."""
    if not processes:  # stopped before the first started
        return None, None
    if strategy is None:
        return _wait(processes), None
    name, chunks = store_args
    if (store := _attach_when_ready(name, chunks, processes)) is None:
        # Learner 0 ended before it created the store (a signal while it started, or a
        # failure): this machine takes no round; the others time out and say so.
        return _wait(processes) or (0, processes[0].exitcode), None
    sync = machines.MachineSync(strategy, store)
    try:
        return _wait_in_rounds(processes, sync, store, sync_period_seconds), sync
    except Exception:  # a machine died (a collective failed): stop ours, say so
        store.request_stop()  # as another learner stops them: not "stopped by SIGTERM"
        store.set_final()  # no last round comes: they save what their store holds
        _stop_all(processes, asked=True)
        raise
    except BaseException:
        store.set_final()
        _stop_all(processes)
        raise
    finally:
        store.close(unlink=False)


def _drain(results) -> dict:
    """The learners' summaries (or errors) they sent on their pipes (`results`, the receiving
    ends in learner order), by learner index; the learners have ended."""
    summaries = {}
    for index, receive in enumerate(results):
        with contextlib.suppress(EOFError, OSError):  # a learner that sent nothing
            if receive.poll(1.0):
                summaries[index] = receive.recv()
        receive.close()
    return summaries


def _outcome(stop, failed, summaries: dict, sync) -> dict:
    """The run's summary (the chief's), or a `LearnerFailed` for a learner that failed."""
    if stop.signal_name and (
        not failed or ("error" not in summaries.get(failed[0], {}) and failed[1] != -signal.SIGKILL)
    ):
        # A learner ended by the signal (SIGTERM, or Ctrl-C's KeyboardInterrupt) before it could
        # hold it, while Python and TensorFlow loaded, had not trained: nothing of it is lost.
        failed = None
        if 0 not in summaries:
            print(f"stopped by {stop.signal_name} while the learners started: nothing new to save")
            return {"stopped_by": stop.signal_name}
    if failed:
        report = summaries.get(failed[0], {})
        cause = report.get("error") or exit_reason(failed[1])
        then = (  # a rejected setting fails again: resuming is no advice
            "" if report.get("setting") else
            " (a running learner saves a checkpoint first): "
            + ("fix the env, then " if report.get("env") else "") + "the same command resumes"
        )  # fmt: skip
        raise LearnerFailed(
            f"learner {failed[0]} of the asynchronous run failed: {cause}; the others were "
            f"stopped{then}"
        )
    signalled = [  # a signal sent to one learner alone stopped them all: the run is unfinished
        summary["stopped_by"] for summary in summaries.values()
        if summary.get("stopped_by") in ("SIGINT", "SIGTERM")
    ]  # fmt: skip
    if stop.signal_name or signalled:  # the learners may have seen another signal first
        summaries[0] = dict(summaries[0], stopped_by=stop.signal_name or signalled[0])
    if sync is not None:
        digest = sync.digest()
        print(
            f"machine sync: {sync.rounds} rounds among {sync.machines} machines; parameters {digest}"
        )
        summaries[0] = dict(summaries[0], sync_rounds=sync.rounds, parameters_digest=digest)
    return summaries[0]


def _attach_when_ready(name: str, chunks: int, processes) -> ParameterStore | None:
    """This machine's store, once the chief learner has created it; None if it ended first."""
    if not ParameterStore.wait_for(name, float("inf"), alive=processes[0].is_alive):
        return None
    return ParameterStore.attach((name, None, chunks))


def _wait_in_rounds(processes, sync, store, period: float) -> tuple[int, int] | None:
    """`_wait` for a machine of several: a round with the other machines every `period` s until
    one of them stops (the total reached, a signal, a failed learner). Then this machine's
    learners push their last change and wait, briefly (`AsyncTeam.before_save`); a last round
    takes in every machine's, and the learners save its parameters: the same on every machine,
    which a rerun of the finished run starts from and leaves as they are."""
    failed, alive = None, dict(enumerate(processes))
    next_round = time.monotonic()
    while True:
        timeout = max(next_round - time.monotonic(), 0.0)
        ready = connection.wait([p.sentinel for p in alive.values()], timeout) if alive else []
        if not alive:
            time.sleep(timeout)
        failed = failed or _reap(alive, ready)
        if time.monotonic() >= next_round:
            next_round += period
            stopping = failed is not None or store.stop_requested or not alive
            if sync.round(stopping):
                break
    # The round stopped the learners through the store's flag (a failed learner's too).
    late = _await_settled(alive, store, machines.settle_seconds())
    failed = failed or late
    try:
        sync.round(True, last=True)  # every machine's last progress
    finally:
        store.set_final()  # the learners save now
    if failed is not None:
        _stop_all(alive.values(), asked=True)
    for process in alive.values():
        process.join()
        if process.exitcode != 0 and failed is None:
            failed = (processes.index(process), process.exitcode)
    return failed


def _await_settled(alive: dict, store, seconds: float) -> tuple[int, int] | None:
    """Waits up to `seconds` until every learner still running pushed its last change; returns
    the first that failed meanwhile (see `_reap`). One still busy after that (a long
    evaluation) pushes its change after the last round, into its own machine's store only."""
    failed, deadline = None, time.monotonic() + seconds
    while alive and store.settled < len(alive) and time.monotonic() < deadline:
        ready = connection.wait([process.sentinel for process in alive.values()], 0.05)
        failed = failed or _reap(alive, ready)
    return failed


def _wait(processes) -> tuple[int, int] | None:
    """Waits for every learner; after the first failure, stops the others. Returns the first
    failure as (index, exit code), or None."""
    failed, alive = None, dict(enumerate(processes))
    while alive:
        ready = connection.wait([p.sentinel for p in alive.values()], timeout=1.0)
        if (failure := _reap(alive, ready)) and failed is None:
            failed = failure
            _stop_all(alive.values())
    return failed


def _reap(alive: dict, ready) -> tuple[int, int] | None:
    """Joins the learners of `alive` (index -> process) whose sentinel is in `ready` and drops
    them; returns the first that failed as (index, exit code), or None."""
    failed = None
    for index, process in list(alive.items()):
        if process.sentinel in ready:
            process.join()
            del alive[index]
            if process.exitcode != 0 and failed is None:
                failed = (index, process.exitcode)
    return failed


def _terminate(processes, number: int = signal.SIGTERM) -> None:
    """Sends `number` (SIGTERM, or the stop signal the launcher got): each learner's trainer
    saves a checkpoint and exits."""
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, number)


def _stop_all(processes, grace: float = 60.0, asked: bool = False) -> None:
    """SIGTERM, then SIGKILL for a learner still running after `grace` seconds; learners
    `asked` to stop through the store (each stops at its next update, and saves) get `grace`
    seconds to end before that."""
    processes = list(processes)
    if asked:
        _join_all(processes, grace)
    _terminate([process for process in processes if process.is_alive()])
    _join_all(processes, grace)
    for process in processes:
        if process.is_alive():
            process.kill()


def _join_all(processes, seconds: float) -> None:
    """Waits up to `seconds` in all for `processes` to end."""
    deadline = time.time() + seconds
    for process in processes:
        process.join(timeout=max(deadline - time.time(), 0.1))


STORE_PREFIX = "tfaccel-ps-"  # + the launcher's pid + "-" + a random tag


def sweep_dead_stores(directory: str = SHM_DIR) -> list[str]:
    """Removes parameter stores whose launcher is dead: a launcher killed with its whole
    process group (SIGKILL) never unlinks its store, and nothing else would. Returns the names
    removed. A store whose pid names a live process (its launcher, or a process that reused the
    pid) is kept."""
    removed = []
    for name in os.listdir(directory):
        if not name.startswith(STORE_PREFIX):
            continue
        pid = name[len(STORE_PREFIX) :].split("-")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))
