"""The learner's `tf.distribute` strategy: one device, every local device, or several machines.

`make_strategy(kind)` is what gin configures (`make_strategy.kind = 'mirrored'`):

- `default`: one device, the first GPU if there is one, else the CPU (TensorFlow's default).
- `mirrored`: `MirroredStrategy` over every local GPU; without GPUs, over the logical CPU devices,
  of which `logical_cpus` > 1 creates that many (for tests and demos; it must run before
  TensorFlow initializes its devices, which `bin/train` guarantees).
- `multi_worker`: `MultiWorkerMirroredStrategy` from the `TF_CONFIG` environment variable; every
  worker process runs its own env pool and sampler on its own envs, and gradients are all-reduced
  across workers each update (docs/architecture.md, "Processes and threads of a run").

Batches are split between the replicas of a process by `shard`: each replica computes the loss of
its share, the learner scales it by 1 / (replicas in sync) and the gradients are summed, which is
the gradient of the mean over the whole batch.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import signal
import sys
import threading

import gin
import numpy as np
import tensorflow as tf

KINDS = ("default", "mirrored", "multi_worker")


@gin.configurable(module="tfaccel", denylist=["cpu_only"])
def make_strategy(
    kind: str = "default",
    logical_cpus: int = 0,
    timeout_seconds: float = 300.0,
    cluster: str = "tf_config",
    slurm_port: int = 8888,
    cpu_only: bool = False,
) -> tf.distribute.Strategy:
    """Builds the strategy; see the module docstring.

    Args:
        kind: `default`, `mirrored` or `multi_worker`.
        logical_cpus: split the CPU into this many logical devices first (0 or 1: don't).
        timeout_seconds: multi_worker: a collective that waits this long for a peer (a dead
            worker) fails with an error instead of hanging.
        cluster: multi_worker: where the cluster comes from: `tf_config` (the TF_CONFIG
            variable) or `slurm` (the Slurm job's tasks, one worker per task, through
            `SlurmClusterResolver`).
        slurm_port: with `slurm`: the port each worker listens on.
        cpu_only: multi_worker: the process computes on its CPU whatever GPUs its node has
            (an asynchronous run's launchers, whose learners take the GPUs: on Slurm,
            `CUDA_VISIBLE_DEVICES` names the task's share for them).

    Raises:
        ValueError: an unknown kind, a malformed `TF_CONFIG`, or logical devices asked for
            after TensorFlow initialized its devices.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown strategy kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    _made["timeout_seconds"] = float(timeout_seconds)
    if logical_cpus > 1:
        split_cpu(logical_cpus)
    if kind == "multi_worker":  # before anything initializes TensorFlow's devices
        resolver = _cluster_resolver(cluster, slurm_port, cpu_only)
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
        with _signal_handlers_kept():
            try:
                return tf.distribute.MultiWorkerMirroredStrategy(
                    cluster_resolver=resolver, communication_options=options
                )
            except tf.errors.UnknownError as error:  # its server could not listen there
                if "Could not start gRPC server" not in str(error):
                    raise
                address = resolver.cluster_spec().task_address("worker", resolver.task_id)
                raise ValueError(
                    f"this worker cannot listen on {address} (its entry in the cluster): the "
                    "port is taken, by another process or an earlier run still ending; free it "
                    "or give the worker another port"
                ) from None
    gpus = [device.name for device in tf.config.list_logical_devices("GPU")]
    if kind == "default":
        return tf.distribute.OneDeviceStrategy(gpus[0]) if gpus else tf.distribute.get_strategy()
    cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(gpus or cpus)


@contextlib.contextmanager
def _signal_handlers_kept():
    """Puts back this process's SIGTERM and SIGINT handlers after the block.

    TensorFlow's coordination service, which `MultiWorkerMirroredStrategy` starts, installs a
    SIGTERM handler of its own that logs "SIGTERM caught" and nothing else (it serves
    `PreemptionCheckpointHandler`, which tfaccel does not use). A job scheduler's SIGTERM while
    the run started up was then lost, the run trained on, and the scheduler's SIGKILL came later
    with nothing saved. With the handlers put back, such a signal stops the run as it stops a
    run of one machine.

    Inside the block SIGINT takes its default action: the process ends at once, with the
    status 130 a shell shows for Ctrl-C. The block waits for every worker of the cluster to
    start, and that wait holds the interpreter (a handler of Python's would run only after
    it); nothing of the run exists yet, so nothing is lost. (SIGTERM stays TensorFlow's there.)
    """
    main = threading.current_thread() is threading.main_thread()  # where handlers can be set
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if main and before[signal.SIGINT] not in (None, signal.SIG_IGN):  # ignored stays ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if main and handler is not None:  # None: a handler not set from Python
                signal.signal(sig, handler)


def _cluster_resolver(cluster: str, slurm_port: int, cpu_only: bool = False):
    if cluster == "tf_config":
        check_tf_config(os.environ.get("TF_CONFIG", ""))
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster == "slurm":
        missing = [
            name for name in ("SLURM_PROCID", "SLURM_STEP_NODELIST") if name not in os.environ
        ]
        if missing:
            raise ValueError(
                f"make_strategy.cluster = 'slurm' needs a Slurm job step ({', '.join(missing)} "
                "not set): start the workers with srun"
            )
        return _slurm_resolver(slurm_port, cpu_only)
    raise ValueError(f"unknown make_strategy.cluster {cluster!r}; valid: tf_config, slurm")


def _slurm_resolver(port: int, cpu_only: bool):
    """The Slurm job step's cluster, and the GPUs of this task: Slurm's own per-task binding
    (`--gpus-per-task`: `CUDA_VISIBLE_DEVICES` names this task's), else an equal share of the
    node's GPUs, which the resolver names. `cpu_only`: the task's replica stays on the CPU (its
    GPUs are for the processes it starts)."""
    gpus = node_gpus()
    if gpus and "SLURM_GPUS_PER_TASK" not in os.environ:  # every task sees the node's GPUs
        tasks = _slurm_tasks_per_node()
        if gpus < tasks:
            raise ValueError(
                f"this Slurm node has {gpus} GPUs for {tasks} tasks: give every task a GPU "
                "of its own (srun --gpus-per-task=1) or run at most one task per GPU"
            )
        kind = _SlurmResolver if cpu_only else tf.distribute.cluster_resolver.SlurmClusterResolver
        return kind(port_base=port, gpus_per_node=gpus, auto_set_gpu=True)
    # No GPU, or Slurm bound this task's: each task is paired with nominal GPU ids (none
    # failed the resolver with "range() arg 3 must not be zero", or nvidia-smi missing),
    # nothing is set, and the strategy is told of this task's own GPUs alone.
    resolver = _SlurmResolver(
        port_base=port, gpus_per_node=4096, gpus_per_task=1, auto_set_gpu=False
    )
    resolver.own_gpus = 0 if cpu_only else gpus
    return resolver


def _slurm_tasks_per_node() -> int:
    """The most tasks the job step runs on one node (`SLURM_STEP_TASKS_PER_NODE`: `2(x3),1`)."""
    counts = []
    for part in os.environ.get("SLURM_STEP_TASKS_PER_NODE", "1").split(","):
        match = re.fullmatch(r"\s*(\d+)(\(x\d+\))?\s*", part)
        counts.append(int(match.group(1)) if match else 1)
    return max(counts)


class _SlurmResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
    """A Slurm job step's cluster that tells the strategy of `own_gpus` GPUs per task (none:
    its replicas are on the CPU), not of those the base class paired each task with."""

    own_gpus = 0

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {"GPU": self.own_gpus} if self.own_gpus else {}


def collective_timeout() -> float:
    """The `timeout_seconds` this process's `make_strategy` took (its default before it ran)."""
    if _made["timeout_seconds"] is None:
        return float(inspect.signature(make_strategy).parameters["timeout_seconds"].default)
    return _made["timeout_seconds"]


_made = {"timeout_seconds": None}  # what `make_strategy` took (gin's macros resolved)


def node_gpus() -> int:
    """The NVIDIA GPUs this process may use: those `CUDA_VISIBLE_DEVICES` names where it is set
    (empty or -1: none), else those `nvidia-smi` lists (0 without it)."""
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = [name.strip() for name in visible.split(",")]
        return len([name for name in names if name and not name.startswith("-")])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def split_cpu(count: int) -> None:
    """Makes the first CPU `count` logical devices (before TensorFlow initializes them)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    present = tf.config.get_logical_device_configuration(cpu)
    if present is not None and len(present) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError as error:
        raise ValueError(
            f"cannot split the CPU into {count} logical devices: TensorFlow has already "
            "initialized its devices (set make_strategy.logical_cpus before anything runs)"
        ) from error


def check_tf_config(text: str) -> dict:
    """Parses `TF_CONFIG` and checks what a multi-worker run needs.

    Raises:
        ValueError: naming what is missing or malformed, with the expected form.
    """
    expected = (
        'expected e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, '
        '"task": {"type": "worker", "index": 0}}'
    )
    if not text:
        raise ValueError(f"make_strategy.kind = 'multi_worker' needs TF_CONFIG; {expected}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not JSON ({error}); {expected}") from None
    config = config if isinstance(config, dict) else {}
    cluster, task = config.get("cluster"), config.get("task")
    workers = cluster.get("worker") if isinstance(cluster, dict) else None
    task = task if isinstance(task, dict) else {}
    if not isinstance(workers, list) or not workers:
        raise ValueError(f"TF_CONFIG has no cluster.worker list; {expected}")
    if "chief" in cluster or task.get("type") == "chief":
        raise ValueError(
            "TF_CONFIG names a 'chief' task: list every process under cluster.worker; "
            f"worker 0 writes the run directory; {expected}"
        )
    for address in workers:
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"TF_CONFIG's cluster.worker entry {address!r} is not host:port (a port number "
                f"of 1..65535); {expected}"
            )
    index = task.get("index")
    if task.get("type") != "worker" or not isinstance(index, int):
        raise ValueError(f"TF_CONFIG has no task type 'worker' with an int index; {expected}")
    if not 0 <= index < len(workers):
        raise ValueError(
            f"TF_CONFIG task index {index} is not in 0..{len(workers) - 1} (the positions of "
            f"cluster.worker's {len(workers)} entries); {expected}"
        )
    return config


def local_replicas(strategy: tf.distribute.Strategy) -> int:
    """Replicas in this process (the devices of this worker)."""
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy
        return 1


def describe(strategy: tf.distribute.Strategy) -> str:
    """One line for the log: the devices this process trains on and, with several replicas,
    how they share the work; e.g. `devices: CPU:0, CPU:1 (2 replicas: each computes 1/2 of
    every batch, and their gradients are averaged)`. Empty for TensorFlow's default strategy
    (the CPU, when there is no GPU), which needs no line."""
    try:
        names = [device.rsplit("device:", 1)[-1] for device in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy
        return ""
    line = f"devices: {', '.join(names)}"
    replicas = len(names) * num_workers(strategy)
    if replicas == 1:
        return line
    workers = num_workers(strategy)
    where = f"{len(names)} here x {workers} workers = " if workers > 1 else ""
    return (
        f"{line} ({where}{replicas} replicas: each computes 1/{replicas} of every batch, and "
        "their gradients are averaged)"
    )


def check_split(strategy: tf.distribute.Strategy, size: int, what: str) -> None:
    """Raises a ValueError naming `what` unless `size` splits evenly among the local replicas."""
    count = local_replicas(strategy)
    if size % count:
        raise ValueError(
            f"{what} is {size}, which does not split among {count} replicas: make it a "
            f"multiple of {count}"
        )


def worker_index(strategy: tf.distribute.Strategy) -> int:
    """This process's index among the workers (0 unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0
    return int(resolver.task_id)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Worker processes training together (1 unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    return max(len(resolver.cluster_spec().as_dict().get("worker", [])), 1)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run directory's shared artifacts (logs, export)."""
    return worker_index(strategy) == 0


class WorkerSum:
    """Sums arrays across the workers of a multi-worker strategy with one replica each (CPU, or
    one device per worker): `__call__(*arrays)` returns the sums as numpy arrays, the same on
    every worker. Every worker must call it the same number of times (a collective)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        device = strategy.extended.worker_devices[0]

        def total(values):
            def replica(local):
                context = tf.distribute.get_replica_context()
                with tf.device(device):  # placed tensors: collectives need them
                    placed = [tf.identity(value) for value in local]
                # One collective per array: a batched one concatenates, so dtypes must agree.
                return [context.all_reduce(tf.distribute.ReduceOp.SUM, v) for v in placed]

            sums = strategy.run(replica, args=(values,))
            return [strategy.experimental_local_results(value)[0] for value in sums]

        self._sum = tf.function(total, autograph=False)

    def __call__(self, *arrays) -> list[np.ndarray]:
        return [value.numpy() for value in self._sum([tf.constant(a) for a in arrays])]


class AnyVote:
    """Workers take a decision at the same step (to stop, to start learning), or the others
    would wait for them in an all-reduce.

    `__call__(flag)` returns True on every worker when any worker's flag is True (one scalar
    all-reduce); with one worker it returns `flag` and costs nothing.
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        self.workers = num_workers(strategy)
        self._sum = WorkerSum(strategy) if self.workers > 1 else None

    def __call__(self, stop: bool) -> bool:
        if self._sum is None:
            return bool(stop)
        return bool(self._sum(np.float32(bool(stop)))[0] > 0.0)


def shard(batch, index: int, count: int, axes):
    """Share `index` of `count` of a nest of arrays, split along `axes` (a matching nest of ints).

    Raises:
        ValueError: a split axis whose length `count` does not divide.
    """

    def take(array, axis):
        array = np.asarray(array)
        length = array.shape[axis]
        if length % count:
            raise ValueError(
                f"a batch axis of {length} does not split among {count} replicas; make the "
                f"envs per group (or the batch size) a multiple of {count}"
            )
        size = length // count
        return np.take(array, np.arange(index * size, (index + 1) * size), axis=axis)

    return tf.nest.map_structure(take, batch, axes)


class SyncTeam:
    """The processes of a synchronous run as the runner sees them: this process alone, or the
    workers of a multi-worker strategy (each stepping as many envs as this one)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self.index, self.size = worker_index(strategy), num_workers(strategy)
        self.learners = self.size  # processes that share the run's frames (and its schedule)
        self.chief = self.index == 0
        self._vote = AnyVote(strategy)

    def run_dir(self, root_dir: str) -> str:
        """Where this worker writes: `root_dir` for the chief, `root_dir/worker-<i>` otherwise."""
        return root_dir if self.chief else os.path.join(root_dir, f"worker-{self.index}")

    def seed(self, seed: int) -> int:
        """This worker's seed: distinct for every worker."""
        return seed + 100_003 * self.index

    def attach(self, agent, counters):
        """The learner as the runner uses it (synchronous workers share it through the strategy)."""
        del counters
        return agent

    def before_save(self, agent) -> None:
        """Nothing to gather: each worker's network holds the run's parameters."""

    def after_restore(self, agent) -> None:
        """Nothing to share: every worker restores the same step's weights."""

    def agent_steps(self, base_steps: int, local_steps: int) -> int:
        """Agent steps of every worker: the restored count plus this worker's times workers."""
        return base_steps + local_steps * self.size

    def stop(self, flag: bool) -> bool:
        """True on every worker once any worker's `flag` is True."""
        return self._vote(flag)

    def tell(self, log, line: str) -> None:
        """Writes `line` (why the run stopped) to this worker's log. A worker other than the
        chief, whose log the console does not show, also prints it on stderr with its index:
        the user of its own command learns why it ended (and its exit status)."""
        log.message(line)
        if not self.chief:
            print(f"worker {self.index}: {line}", file=sys.stderr, flush=True)
