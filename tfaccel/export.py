"""The policy as an artifact: a SavedModel that plays without tfaccel, and the json that says how.

`export_policy` writes a directory (a run's `policy/`) holding

- a SavedModel whose `serving_default` signature takes `observation`, uint8 [None, H, W, C] (the
  preprocessed, stacked frames), and returns `action` int32 [None] (greedy), the raw head under
  its name (`logits` [None, A], `q_values` [None, A] or `probabilities` [None, A, N]), and for
  logits `sampled_action` int32 [None] (drawn from the softmax);
- `tfaccel_policy.json`: format, tfaccel version, observation shape and dtype, number of actions,
  head name, the Atari preprocessing (`AtariConfig.describe()`: game, frame skip, crop, size,
  stack, action names, ...) and the caller's `extra` (e.g. env frames trained).

The directory is written next to its final place and renamed over it, so a crash never leaves a
half-written policy. `load_policy` (from `tfaccel.policy_client`, which imports no tfaccel) reads
it back with `tf.saved_model.load` alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel.console import io_failure
from tfaccel.envs.atari import AtariConfig
from tfaccel.policy_client import FORMAT, FORMAT_VERSION, HEADS, POLICY_FILE, load_policy

__all__ = ["HeadFn", "export_policy", "load_policy", "select_head"]

HeadFn = Callable[[Any], tuple[str, tf.Tensor]]


def select_head(head: str) -> HeadFn:
    """The default head function: the network's output, or its first element, named `head`.

    `PolicyValueNetwork` returns (logits, value): `select_head("logits")` exports the logits. A
    network returning one tensor of Q-values is exported with `select_head("q_values")`.
    """

    def head_fn(output):
        if isinstance(output, dict):
            return head, output[head]
        if isinstance(output, (tuple, list)):
            return head, output[0]
        return head, output

    return head_fn


def export_policy(
    network: keras.Model,
    env_config: AtariConfig | None,
    path: str,
    *,
    head: str = "logits",
    head_fn: HeadFn | None = None,
    support: Sequence[float] | None = None,
    extra: dict | None = None,
) -> None:
    """Writes `network`'s greedy policy as a SavedModel with `tfaccel_policy.json` to `path`.

    Args:
        network: a built Keras model taking uint8 observations [B, H, W, C].
        env_config: the env the network plays, described in the json so a client can rebuild its
            observations; None for envs without such a description (then the observation shape
            comes from `network.spec`).
        path: the policy directory; an existing policy there is replaced atomically (one
            writer per path: an export removes the temp dirs that crashed exports left beside it).
        head: name of the raw head output: `logits`, `q_values` or `probabilities`.
        head_fn: maps the network's output to (head name, tensor), for networks whose output the
            default (`select_head(head)`) does not pick; its name must be `head`.
        support: atom values [N] of a distributional head (`probabilities` [B, A, N]); the greedy
            action maximizes the expected value. Written to the json.
        extra: JSON-serializable facts to keep in the json (numpy scalars and arrays allowed).

    Raises:
        ValueError: a variable holds NaN or inf (the message names it), the shapes of the
            network, env and head disagree, `path` holds something that is not a tfaccel policy,
            or `extra` is not JSON-serializable.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    if (head == "probabilities") != (support is not None):
        raise ValueError("support is required for head 'probabilities', and only for it")
    observation_shape, dtype = _observation_spec(network, env_config)
    _check_finite(network)
    extra = json.loads(json.dumps(extra or {}, default=_to_json))  # fails early, not mid-write
    module = _PolicyModule(
        network, (observation_shape, dtype), head, head_fn or select_head(head), support
    )
    preprocessing = env_config.describe() if env_config is not None else None
    if preprocessing is not None and len(preprocessing["action_names"]) != module.num_actions:
        raise ValueError(
            f"the network has {module.num_actions} actions but {env_config.game} has "
            f"{len(preprocessing['action_names'])}: {preprocessing['action_names']}"
        )
    metadata = dict(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        tfaccel_version=tfaccel.__version__,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        observation=dict(shape=list(observation_shape), dtype=dtype),
        num_actions=module.num_actions,
        head=head,
        outputs=sorted(module.output_names),
        support=None if support is None else [float(z) for z in support],
        preprocessing=preprocessing,
        extra=extra,
    )

    def write(directory: str) -> None:
        tf.saved_model.save(module, directory, signatures={"serving_default": module.serve})
        with open(os.path.join(directory, POLICY_FILE), "w") as handle:
            json.dump(metadata, handle, indent=2)
            handle.write("\n")

    _write_atomically(path, write)


def _observation_spec(network: keras.Model, env_config: AtariConfig | None) -> tuple[tuple, str]:
    """(shape, dtype name) of one observation, from the network's spec and/or the env config."""
    network_spec = getattr(getattr(network, "spec", None), "observation", None)
    specs = {}
    if network_spec is not None:
        specs["network.spec"] = (tuple(network_spec.shape), np.dtype(network_spec.dtype).name)
    if env_config is not None:
        spec = env_config.observation_spec
        specs["env_config"] = (tuple(spec.shape), np.dtype(spec.dtype).name)
    if not specs:
        raise ValueError("cannot tell the observation shape: give env_config or a network.spec")
    if len(set(specs.values())) > 1:
        raise ValueError(f"the observation shapes disagree: {specs}")
    return next(iter(specs.values()))


def _check_finite(network: keras.Model) -> None:
    for variable in network.variables:
        values = np.asarray(variable.numpy())
        bad = np.size(values) - int(np.isfinite(values).sum())
        if bad:
            name = getattr(variable, "path", variable.name)
            raise ValueError(
                f"refusing to export: variable {name} holds NaN or inf "
                f"({bad} of {np.size(values)} values)"
            )


def _to_json(value):
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise ValueError(f"extra must be JSON-serializable; got {type(value).__name__}: {value!r}")


class _PolicyModule(tf.Module):
    """The network's variables and one serving function; the network itself is not tracked.

    Tracking a Keras 3 model as a tf.Module attribute would save its Keras internals too; the
    variables and the traced function are all a SavedModel client needs (as Keras' own
    `ExportArchive` does).
    """

    def __init__(self, network, observation, head, head_fn, support):
        super().__init__(name="tfaccel_policy")
        self.network_variables = list(network.variables)
        self.support = None if support is None else tf.constant(support, tf.float32)  # [N]
        shape, dtype = observation
        signature = tf.TensorSpec([None, *shape], tf.as_dtype(dtype), name="observation")
        traced = {}

        def serve(observation):
            name, values = head_fn(network(observation, training=False))
            if name != head:
                raise ValueError(f"head_fn returned head {name!r}, but head is {head!r}")
            values = tf.cast(values, tf.float32)
            traced["shape"] = values.shape
            outputs = {head: values, "action": self._greedy(head, values)}
            if head == "logits":
                sampled = tf.random.categorical(values, 1, dtype=tf.int32)  # [B, 1]
                outputs["sampled_action"] = sampled[:, 0]
            return outputs

        self.serve = tf.function(serve, input_signature=[signature], autograph=False)
        concrete = self.serve.get_concrete_function()
        shape = traced["shape"]
        rank = 3 if head == "probabilities" else 2
        if shape.rank != rank or shape[1] is None:
            raise ValueError(f"head {head!r} must have rank {rank} with known actions, got {shape}")
        if support is not None and shape[2] != len(support):
            raise ValueError(f"{len(support)} support atoms, but probabilities are {shape}")
        self.num_actions = int(shape[1])
        self.output_names = list(concrete.structured_outputs)

    def _greedy(self, head: str, values: tf.Tensor) -> tf.Tensor:
        if head == "probabilities":
            values = tf.reduce_sum(values * self.support, axis=-1)  # [B, A] expected values
        return tf.argmax(values, axis=-1, output_type=tf.int32)  # [B]


class WriteError(ValueError):
    """The policy could not be written (a full disk, a read-only directory)."""


def _write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Runs `write(tmp)` on a fresh directory beside `path`, then puts it in place of `path`."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    if os.path.lexists(path) and not _replaceable(path):
        raise ValueError(
            f"refusing to replace {path}: it is not a tfaccel policy directory (no {POLICY_FILE})"
        )
    for stale in glob.glob(os.path.join(parent, f".{name}.tmp-*")):  # from a crashed export
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        write(tmp)
        _fsync_tree(tmp)
        if not os.path.lexists(path):
            os.rename(tmp, path)
        elif _exchange(tmp, path):  # atomic swap: `path` is never missing
            shutil.rmtree(tmp)  # now the old policy
        else:  # no renameat2: a short window in which `path` is missing
            old = tmp + "-old"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old)
        _fsync(parent)
    except (OSError, tf.errors.OpError) as error:  # a full disk, say: one line, not a traceback
        shutil.rmtree(tmp, ignore_errors=True)
        kept = "the policy there before is intact" if os.path.lexists(path) else "none was there"
        raise WriteError(
            f"cannot write the policy to {path} ({type(error).__name__}: {io_failure(error)}); "
            f"{kept}"
        ) from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replaceable(path: str) -> bool:
    if not os.path.isdir(path) or os.path.islink(path):
        return False
    return not os.listdir(path) or os.path.isfile(os.path.join(path, POLICY_FILE))


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths atomically with Linux renameat2(RENAME_EXCHANGE); False if unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    for directory, _, files in os.walk(root):
        for file in files:
            _fsync(os.path.join(directory, file))
        _fsync(directory)
