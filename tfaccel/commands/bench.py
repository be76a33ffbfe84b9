"""Sampler throughput: the machine's limit, tfaccel's pool and the installed peers, in one run.

    tfaccel-bench --game=pong --seconds=10 --json=sampler_pong.json --plot=sampler_pong.png

Agent steps per second summed over all envs, after a warm-up, with the training preprocessing:
one process stepping one env (the limit is that times the cores), the pool with random actions,
with batched inference (one group, then two alternating), end-to-end A2C training, and the peers
that are installed (a peer that is not is left out). The JSON's schema is in docs/results.md.
"""

import json
import os
import sys

from tfaccel import commands


def layouts(text: str, flag: str, min_workers: int = 1) -> list[tuple[int, int]]:
    """`2x8,4x16` -> [(2, 8), (4, 16)] (workers x envs per worker); exits with one line for a
    layout that is not one, has fewer than `min_workers` workers or no env, or whose envs per
    worker do not split into the 2 alternating groups every measurement but the synchronous
    one uses."""
    found = []
    for value in [part for part in text.split(",") if part]:
        try:
            workers, per_worker = (int(part) for part in value.lower().split("x"))
        except ValueError:
            commands.fail(f"layout {value!r} is not WORKERSxENVS_PER_WORKER, e.g. 2x16")
        if workers < min_workers or per_worker < 1:
            commands.fail(
                f"{flag}: layout {value!r} needs at least {min_workers} worker(s) and 1 env per "
                "worker"
            )
        if per_worker % 2:
            commands.fail(
                f"{flag}: layout {value!r} has {per_worker} envs per worker, which do not split "
                f"into 2 alternating groups: give a multiple of 2, e.g. {workers}x{per_worker + 1}"
            )
        found.append((workers, per_worker))
    return found


def counts(text: str, flag: str) -> list[int]:
    """`8,16` -> [8, 16]; exits with one line unless each is a positive integer."""
    try:
        found = [int(part) for part in text.split(",") if part]
    except ValueError:
        found = [0]
    if any(count < 1 for count in found):
        commands.fail(f"{flag} {text!r} is not a list of positive env counts, e.g. 8,16")
    return found


def parse_flags(argv=None):
    parser = commands.parser(__doc__)
    parser.add_argument("--game", default="pong", help="ale-py game id or CamelCase name")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds per row, after a warm-up"
    )
    parser.add_argument("--json", default=None, help="where to write the results (JSON)")
    parser.add_argument("--plot", default=None, help="where to draw steps/s against envs (PNG)")
    parser.add_argument(
        "--layouts",
        default="1x8,2x4,2x8,2x16,2x32,4x8,4x16",
        help="pools with random actions, WORKERSxENVS_PER_WORKER, comma-separated",
    )
    parser.add_argument(
        "--inference_layouts", default="2x8,2x16,2x32,2x64", help="pools with batched inference"
    )
    parser.add_argument(
        "--training_layouts", default="2x16", help="end-to-end A2C training (a2c.gin)"
    )
    parser.add_argument("--peer_envs", default="8,16,32", help="env counts for the peers")
    parser.add_argument(
        "--peers",
        default="gymnasium_async,ale_py_vector,tf_agents_parallel",
        help="peers to measure if installed",
    )
    parser.add_argument(
        "--tf_threads",
        type=int,
        default=1,
        help="TensorFlow threads for inference (0: TensorFlow's own choice)",
    )
    parser.add_argument(
        "--worker_niceness", type=int, default=5, help="nice value of env workers with inference"
    )
    return parser.parse_args(argv)


def check_flags(flags) -> dict:
    """The flags' values, checked before anything is measured (a bad one would otherwise end
    the run after minutes of measuring, and lose them): one line and exit status 1 for a bad
    one."""
    from tfaccel.evaluate import check_output_file

    if not 0 < flags.seconds < float("inf"):
        commands.fail(f"--seconds must be a positive number of seconds, got {flags.seconds}")
    if flags.tf_threads < 0:
        commands.fail(
            f"--tf_threads must be 0 (TensorFlow's choice) or more, got {flags.tf_threads}"
        )
    if not 0 <= flags.worker_niceness <= 19:
        commands.fail(f"--worker_niceness must be from 0 to 19, got {flags.worker_niceness}")
    for name in ("json", "plot"):
        if getattr(flags, name) is not None:
            try:
                check_output_file(getattr(flags, name), f"--{name}")
            except ValueError as error:
                commands.fail(str(error))
    return {
        "pool_layouts": layouts(flags.layouts, "--layouts"),
        "inference_layouts": layouts(flags.inference_layouts, "--inference_layouts"),
        # 0 workers: the envs step in the training process (PoolConfig.num_workers = 0)
        "training_layouts": layouts(flags.training_layouts, "--training_layouts", min_workers=0),
        "peer_envs": counts(flags.peer_envs, "--peer_envs"),
        "peers": [peer for peer in flags.peers.split(",") if peer],
    }


def main(argv=None) -> int:
    flags = parse_flags(argv)
    checked = check_flags(flags)
    if flags.tf_threads:
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(flags.tf_threads)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    commands.tensorflow_started_quietly()
    with commands.tensorflow_imported_quietly():
        from tfaccel.bench import sampler

    unknown = set(checked["peers"]) - set(sampler.PEERS)
    if unknown:
        commands.fail(f"unknown peers {sorted(unknown)}; valid: {sorted(sampler.PEERS)}")
    try:
        result = sampler.run(
            flags.game,
            flags.seconds,
            checked["pool_layouts"],
            checked["inference_layouts"],
            checked["peer_envs"],
            checked["peers"],
            flags.worker_niceness,
            checked["training_layouts"],
        )
    except ValueError as error:
        commands.fail(commands.first_line(error))
    result["tf_threads"] = flags.tf_threads
    result["summary"] = sampler.summary(result)
    for key, value in result["summary"].items():
        print(f"{key:>40}: {value:.2f}")
    if flags.json:
        with open(flags.json, "w") as handle:
            json.dump(result, handle, indent=2)
    if flags.plot:
        sampler.plot(result, flags.plot)
    return 0


def run() -> None:
    """The `tfaccel-bench` console script (and `bin/bench_sampler`)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
