#!/usr/bin/env python3
"""Which ReLU units of a run's network still respond to its game's frames.

    .venv/bin/python benchmarks/dead_units.py --run_dir=runs/a3c_pong_bf16_s2 \
        --name=a3c/pong_bf16_s2

Restores the latest checkpoint of --run_dir into the network its operative_config.gin describes
(`PolicyValueNetwork`, or `QNetwork` for the DQN family, on its torso), plays --steps agent steps of the run's game with random actions in each of --envs envs, and for
each layer of the torso counts the units that are positive on at least one of those
observations. A layer with none alive passes nothing upward: the value and the policy no longer
depend on the observation and no gradient reaches the layer again. Also reports the spread of the
network's output over the observations (the value, or the Q values; the standard deviation over
observations, averaged over the output's units). Writes
benchmarks/results/learning/<name>__dead_units.json; `--name` is `<algorithm>/<run>`, the run's
summary name (benchmarks/summarize_run.py).
"""

import argparse
import functools
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

from tfaccel import networks  # noqa: E402
from tfaccel.bench import results as results_file  # noqa: E402
from tfaccel.envs.atari import AtariConfig, AtariEnv  # noqa: E402
from tfaccel.types import EnvSpec  # noqa: E402

TORSOS = {"a3c_torso": networks.a3c_torso, "nature_torso": networks.nature_torso}


def build_network(run_dir: str, spec: EnvSpec):
    """The network of the run in `run_dir`, as its operative_config.gin describes it."""
    with open(os.path.join(run_dir, "operative_config.gin")) as handle:
        config = handle.read()

    def binding(name: str, default: str) -> str:
        found = re.search(rf"^{re.escape(name)} = (.+)$", config, re.MULTILINE)
        return found.group(1).strip() if found else default

    off_policy = binding("run.trainer", "") == "@train_off_policy"
    trainer = "train_off_policy" if off_policy else "train"
    torso_name = binding(f"{trainer}.torso", "@a3c_torso").lstrip("@")
    options = {
        option: binding(f"{torso_name}.{option}", "False") == "True"
        for option in ("center_frames", "subtract_background")
    }  # the layers the checkpoint holds (initializers do not matter: its weights replace them)
    # an early form of the offset (the game's mean pixel), the same layer and variable
    options["subtract_background"] |= binding(f"{torso_name}.subtract_game_mean", "") == "True"
    torso = functools.partial(TORSOS[torso_name], **options)
    if not off_policy:
        return networks.PolicyValueNetwork(spec, torso=torso)
    dueling = binding("train_off_policy.dueling", "False") == "True"
    atoms = int(binding("DQNConfig.num_atoms", "1"))
    return networks.QNetwork(spec, torso=torso, dueling=dueling, num_atoms=atoms)


def run_game(run_dir: str) -> str:
    """The game of the run in `run_dir` (its operative_config.gin's `AtariConfig.game`)."""
    with open(os.path.join(run_dir, "operative_config.gin")) as handle:
        found = re.search(r"^AtariConfig.game = '(.+)'$", handle.read(), re.MULTILINE)
    return found.group(1) if found else "pong"


def observations(
    envs: int, steps: int, seed: int, game: str = "pong"
) -> tuple[np.ndarray, EnvSpec]:
    """Observations of random play, `envs` games side by side, every one of `steps` steps, and
    the games' spec."""
    games = [AtariEnv(AtariConfig(game=game), seed=seed + i) for i in range(envs)]
    current = [game.reset() for game in games]
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(steps):
        seen.extend(current)
        for i, game in enumerate(games):
            result = game.step(int(rng.integers(game.spec.num_actions)))
            ended = result.terminated or result.truncated
            current[i] = game.reset() if ended else result.observation
    return np.stack(seen), games[0].spec


def alive_units(run_dir: str, envs: int = 4, steps: int = 200, seed: int = 0):
    """{layer: {units, alive}}, the output's spread and the checkpoint read, for the latest
    checkpoint of `run_dir` on `envs` x `steps` observations of random play."""
    frames, spec = observations(envs, steps, seed, run_game(run_dir))
    network = build_network(run_dir, spec)
    path = tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if path is None:
        sys.exit(f"error: no checkpoint in {run_dir}/checkpoints")
    tf.train.Checkpoint(network=network).restore(path).expect_partial()  # read only
    layers = {}
    x = tf.convert_to_tensor(frames.astype(np.float32) / 255.0)
    for layer in network.torso.layers:
        x = layer(x)
        if hasattr(layer, "activation"):  # the convolutions and the dense layer (ReLU)
            active = tf.reduce_any(tf.reshape(x, [len(frames), -1, x.shape[-1]]) > 0, axis=[0, 1])
            layers[layer.name] = {
                "units": int(x.shape[-1]),
                "alive": int(tf.reduce_sum(tf.cast(active, tf.int32))),
            }
    output = network(frames)
    output = output[1] if isinstance(output, tuple) else output  # the value, or the Q values
    spread = np.std(output.numpy().reshape(len(frames), -1), axis=0).mean()
    return layers, float(spread), path, len(frames)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run_dir", required=True)
    parser.add_argument("--name", required=True, help="<algorithm>/<run>, e.g. a3c/pong_bf16_s2")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="agent steps per env")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layers, spread, path, count = alive_units(args.run_dir, args.envs, args.steps, args.seed)
    document = {
        "run_dir": args.run_dir,
        "checkpoint": path,
        "observations": count,
        "layers": layers,
        "output_std": spread,
    }
    for name, layer in layers.items():
        print(f"{name}: {layer['alive']} of {layer['units']} units positive on some observation")
    print(f"output spread over {count} observations: {spread:.3g}")
    out = os.path.join(ROOT, "benchmarks", "results", "learning", f"{args.name}__dead_units.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    results_file.write_json(out, document)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
