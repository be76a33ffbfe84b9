"""Keras 3 networks of the papers. Inputs are uint8 frames [B, H, W, C], scaled to [0, 1] inside
the model (observations of any other dtype, e.g. float vectors for `mlp_torso`, go in as they are).

- `a3c_torso`: the policy-gradient network of Mnih et al. (2016) used by Stooke & Abbeel (2018)
  and PAAC: conv 16 8x8/4, conv 32 4x4/2, FC 256, ReLU.
- `nature_torso`: the Nature DQN network (Mnih et al., 2015): conv 32 8x8/4, conv 64 4x4/2,
  conv 64 3x3/1, FC 512, ReLU.

Shapes and action counts come from the env's spec, never from configuration.

Precision (`set_precision`): under `mixed_bfloat16` the torsos compute in bfloat16 while the
variables and the heads stay float32, so losses, logits and Q values are float32 as always.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import gin
import keras
import numpy as np
import tensorflow as tf

from tfaccel.types import EnvSpec

PRECISIONS = ("auto", "float32", "mixed_bfloat16")


@gin.configurable(module="tfaccel")
def set_precision(policy: str = "auto") -> str:
    """Sets Keras's dtype policy for the networks built afterwards (the trainers call it before
    building theirs) and says which, in one line for the log: `float32`, `mixed_bfloat16`
    (bfloat16 convolutions and matrix products with float32 variables) or `auto`, which picks
    `mixed_bfloat16` where the hardware computes bfloat16 natively (`choose_precision`).

    Raises:
        ValueError: an unknown policy.
    """
    if policy not in PRECISIONS:
        raise ValueError(f"unknown precision {policy!r}; valid: {', '.join(PRECISIONS)}")
    why = "set_precision.policy"
    if policy == "auto":
        policy, why = choose_precision()
        why += "; set_precision.policy overrides"
    keras.mixed_precision.set_global_policy(policy)
    return f"precision: {policy} ({why})"


def _cpuinfo(field: str) -> str | None:
    """The value of a field of Linux's /proc/cpuinfo (its first CPU), or None where it cannot
    be read."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags, or None where they cannot be read."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def _gpu_capabilities() -> list[tuple[str, tuple[int, int] | None]]:
    """Each local GPU's name and CUDA compute capability (None where TensorFlow does not tell)."""
    found = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        found.append((details.get("device_name", gpu.name), details.get("compute_capability")))
    return found


# A bfloat16 matrix product must run at least this many times as fast as a float32 one for
# `auto` to choose bfloat16 on a CPU with AVX-512 BF16 and no AMX. The C51 update at batch 256
# followed the product on the three such machines measured (benchmarks/learner_speed.py):
# products 1.9x and 1.9x as fast gave updates 1.6x and 1.8x as fast; a product 0.68x as fast
# gave an update 0.71x as fast.
BFLOAT16_MIN_SPEEDUP = 1.4


# Set by a process that measured `bfloat16_speedup` for the processes it starts (the learners
# of an asynchronous run), so that all of them choose alike rather than each timing the product
# while the others load the cores.
SPEEDUP_VARIABLE = "TFACCEL_BFLOAT16_SPEEDUP"

# Where `bfloat16_speedup` keeps its measurement (default: $XDG_CACHE_HOME/tfaccel, else
# ~/.cache/tfaccel).
CACHE_VARIABLE = "TFACCEL_CACHE_DIR"


def cache_dir() -> Path:
    """The folder of what tfaccel keeps for this machine between runs (`CACHE_VARIABLE`)."""
    if given := os.environ.get(CACHE_VARIABLE):
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfaccel"


def _shown(path: Path) -> str:
    """`path` with the home folder as `~`."""
    home = os.path.expanduser("~")
    text = str(path)
    return (
        "~" + text[len(home) :] if home not in ("", "/") and text.startswith(home + "/") else text
    )


# Settings of the process that change how fast TensorFlow's kernels run, so they are part of
# what a kept speedup is for.
KERNEL_VARIABLES = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def speedup_file() -> Path:
    """The file that keeps `bfloat16_speedup` for this CPU model, core count, TensorFlow
    version, thread count and kernel settings (`KERNEL_VARIABLES`)."""
    model = _cpuinfo("model name") or ""
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    kernels = ",".join(f"{name}={os.environ.get(name, '')}" for name in KERNEL_VARIABLES)
    machine = (
        f"{model}|{os.cpu_count()} cores|tensorflow {tf.__version__}|{threads} threads|{kernels}"
    )
    digest = hashlib.sha1(machine.encode()).hexdigest()[:12]
    return cache_dir() / f"bfloat16_speedup-{digest}.json"


def _read_speedup(path: Path) -> float | None:
    """The speedup kept in `path`, or None where there is none (or it is not a timing ratio)."""
    try:
        ratio = json.loads(path.read_text())["speedup"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float):
            return None
        ratio = float(ratio)
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return None
    return ratio if 0 < ratio < float("inf") else None


def _keep_speedup(path: Path, ratio: float) -> float:
    """Keeps `ratio` in `path` unless another process kept one first, and returns the one kept
    (the first writer wins, so that processes measuring at once still choose alike); `ratio`
    where the folder cannot be written."""
    record = {
        "speedup": ratio,
        "cpu": _cpuinfo("model name") or "",
        "cores": os.cpu_count(),
        "tensorflow": tf.__version__,
        "threads": tf.config.threading.get_intra_op_parallelism_threads(),
        **{name: os.environ[name] for name in KERNEL_VARIABLES if name in os.environ},
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "w") as f:
            json.dump(record, f, indent=1)
        os.chmod(temporary, 0o644)  # readable by the other users of a shared cache folder
        for _ in range(2):
            try:
                os.link(temporary, path)  # fails if the file exists: written whole or not at all
                return ratio
            except FileExistsError:
                if (kept := _read_speedup(path)) is not None:
                    return kept
                path.unlink(missing_ok=True)  # a damaged file: try again without it
            except OSError:  # a file system without hard links
                if not path.exists():
                    os.replace(temporary, path)
                    temporary = None
                return _read_speedup(path) or ratio
    except OSError:
        pass
    finally:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
    return ratio


def _measure_speedup(size: int, repeats: int) -> float:
    """Times a [size, size] matrix product in float32 and in bfloat16, in turns, each keeping
    its best time (so a busy machine slows both alike); NaN where bfloat16 cannot run here."""
    products = {}
    try:
        with tf.device("/CPU:0"):
            for dtype in (tf.float32, tf.bfloat16):
                matrix = tf.cast(tf.random.stateless_normal([size, size], seed=(0, 0)), dtype)
                products[dtype] = tf.function(
                    lambda m=matrix: tf.reduce_sum(tf.cast(tf.matmul(m, m), tf.float32))
                )
                products[dtype]().numpy()  # traced and warm
        best = dict.fromkeys(products, float("inf"))
        for _ in range(repeats):
            for dtype, product in products.items():
                start = time.perf_counter()
                product().numpy()
                best[dtype] = min(best[dtype], time.perf_counter() - start)
    except tf.errors.OpError:
        return float("nan")
    return best[tf.float32] / best[tf.bfloat16]


@functools.cache
def bfloat16_speedup(size: int = 1024, repeats: int = 5) -> float:
    """How many times as fast a [size, size] matrix product runs in bfloat16 as in float32 on
    this machine's CPU. Measured once per machine and kernel settings (about 0.3 s) and kept in
    `speedup_file()`: every later run there takes that figure, so that the precision `'auto'`
    chooses, and with it the run a seed gives, does not depend on how busy the machine was at
    the start of each run (the first figure stays, even one timed under load: delete the file
    to time it again). `SPEEDUP_VARIABLE` gives it where a parent process measured. NaN where the
    product cannot run in bfloat16 here."""
    if given := os.environ.get(SPEEDUP_VARIABLE):
        return float(given)
    path = speedup_file()
    if (kept := _read_speedup(path)) is not None:
        return kept
    ratio = _measure_speedup(size, repeats)
    return ratio if ratio != ratio else _keep_speedup(path, ratio)


def speedup_for_children(gpus: int, cpu_flags=_cpu_flags) -> dict[str, str]:
    """`{SPEEDUP_VARIABLE: the measured speedup}` where `'auto'` measures it (a CPU with AVX-512
    BF16 and no AMX, no GPU), for the environment of processes this one starts; else `{}`."""
    flags = cpu_flags() or set()
    if gpus or "amx_bf16" in flags or "avx512_bf16" not in flags:
        return {}
    return {SPEEDUP_VARIABLE: repr(bfloat16_speedup())}


def choose_precision(
    cpu_flags=_cpu_flags, gpus=_gpu_capabilities, speedup=bfloat16_speedup
) -> tuple[str, str]:
    """The faster precision on this machine and why: `mixed_bfloat16` on GPUs of compute
    capability 8.0 and newer, on CPUs with AMX, and on CPUs with AVX-512 BF16 (and no AMX)
    where a bfloat16 matrix product measures at least `BFLOAT16_MIN_SPEEDUP` times as fast as
    float32; `float32` elsewhere. Measured with benchmarks/learner_speed.py, a C51 update at
    batch 256 on 2 cores: AMX 84 -> 44 ms in bfloat16 (learner_speed__amx.json); AVX-512 BF16
    without AMX 128 -> 81 ms and 159 -> 88 ms on two machines (learner_speed.json,
    learner_speed__avx512_bf16.json) but 128 -> 181 ms on a third (learner_speed__avx512.json),
    hence the measurement there; AVX2 several times slower (learner_speed__avx2.json).
    `cpu_flags`, `gpus` and `speedup` read this machine; tests pass others."""
    devices = gpus()
    if devices:
        if all(cc and cc >= (8, 0) for _, cc in devices):
            return "mixed_bfloat16", "auto: GPUs with native bfloat16"
        return "float32", "auto: a GPU without native bfloat16 (compute capability under 8.0)"
    flags = cpu_flags() or set()
    if "amx_bf16" in flags:
        return "mixed_bfloat16", "auto: this CPU has AMX"
    if "avx512_bf16" in flags:
        ratio = speedup()
        if ratio != ratio:  # NaN: it could not run
            return (
                "float32",
                "auto: this CPU has AVX-512 BF16, but TensorFlow ran no bfloat16 product",
            )
        chosen = "mixed_bfloat16" if ratio >= BFLOAT16_MIN_SPEEDUP else "float32"
        notes = [] if chosen == "mixed_bfloat16" else [f"bfloat16 from {BFLOAT16_MIN_SPEEDUP}x"]
        kept = _read_speedup(path := speedup_file())
        if kept == ratio:
            notes.append(f"timed once, kept in {_shown(path)}")
        elif kept is None:  # a cache folder that is a file, or read-only: each run times it
            notes.append(
                f"timed at each start: it cannot be kept in {_shown(path.parent)} (set "
                f"{CACHE_VARIABLE} to a folder you can write to)"
            )
        why = (
            f"auto: this CPU has AVX-512 BF16 without AMX, and a bfloat16 matrix product ran "
            f"{ratio:.2f}x as fast as float32"
        )
        return chosen, why + (f" ({'; '.join(notes)})" if notes else "")
    return "float32", "auto: this CPU has neither AMX nor AVX-512 BF16 and would emulate bfloat16"


def precision_warning(
    policy: str | None = None, cpu_flags=_cpu_flags, gpus=_gpu_capabilities, speedup=None
):
    """Why `policy` (default: the one set) would slow this machine down, or None.

    `mixed_bfloat16` pays on GPUs of compute capability 8.0 and newer and on CPUs with AMX
    (`choose_precision`). With AVX-512 BF16 alone it depends on the machine: warned where a
    bfloat16 matrix product measures slower than float32 (`bfloat16_speedup`; 0.68x on the
    machine where the C51 update ran 128 -> 181 ms). Without it TensorFlow emulates bfloat16:
    on a 2-core AVX2 CPU (AMD EPYC) the C51 update at batch 256 trained 181 samples/s in
    bfloat16 against 897 in float32 (learner_speed__avx2.json).
    `cpu_flags`, `gpus` and `speedup` (default `bfloat16_speedup`) read this machine; tests
    pass others.
    """
    policy = policy or keras.mixed_precision.global_policy().name
    if policy != "mixed_bfloat16":
        return None
    advice = "set_precision.policy = 'float32' is faster here"
    devices = gpus()
    if devices:
        old = [f"{name} ({'.'.join(map(str, cc))})" for name, cc in devices if cc and cc < (8, 0)]
        if not old:
            return None
        return (
            f"mixed_bfloat16 on GPUs without native bfloat16 (compute capability under 8.0: "
            f"{', '.join(old)}); {advice}"
        )
    flags = cpu_flags()
    if flags is None or "amx_bf16" in flags:
        return None
    if "avx512_bf16" in flags:
        ratio = (speedup or bfloat16_speedup)()
        if ratio >= 1.0:
            return None
        return (
            f"mixed_bfloat16 on a CPU with AVX-512 BF16 where a bfloat16 matrix product ran "
            f"{ratio:.2f}x as fast as float32; {advice}"
        )
    return (
        "mixed_bfloat16 on a CPU without AVX-512 BF16 or AMX: TensorFlow emulates bfloat16, and "
        f"training is several times slower than in float32; {advice}"
    )


def _scaled(observation: tf.Tensor, dtype) -> tf.Tensor:
    """Observations as `dtype`: uint8 frames scaled to [0, 1], any other dtype as it is."""
    if observation.dtype != tf.uint8:
        return tf.cast(observation, dtype)
    if tf.as_dtype(dtype) == tf.float32:
        return tf.cast(observation, tf.float32) * (1.0 / 255.0)
    return _scale_frames(observation, tf.as_dtype(dtype).name)


# Frames in float32 go through TensorFlow's own kernels, which are vectorized on every CPU.
# In bfloat16 those kernels compute element by element, and a mean taken in bfloat16 can be far
# off (an average pool over the frame was off by 0.5 on an AVX2 CPU); so the passes over frames
# in a lower precision are compiled with XLA, computing in float32. On the AMX machine, XLA
# scaling and the subtraction of that pool's mean took 17.3 ms for the 512 observations of a
# bfloat16 C51 update at batch 256, against 39.8 with TensorFlow's kernels (this version, the
# mean in XLA as well, is not timed there yet); on an AVX2 machine, float32 through XLA was
# slower than TensorFlow's kernels (benchmarks/preprocessing_speed.py, README "Q-value training
# throughput").
@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _scale_frames(frames: tf.Tensor, dtype: str) -> tf.Tensor:
    return tf.cast(tf.cast(frames, tf.float32) * (1.0 / 255.0), dtype)


@tf.function(jit_compile=True, reduce_retracing=True, autograph=False)
def _center_in_float32(x: tf.Tensor) -> tf.Tensor:
    wide = tf.cast(x, tf.float32)
    return tf.cast(wide - tf.reduce_mean(wide, axis=[1, 2], keepdims=True), x.dtype)


def mlp_torso(units: tuple[int, ...] = (64, 64)) -> list[keras.layers.Layer]:
    """New dense layers (tanh) for vector observations [B, D] (or anything, flattened first)."""
    return [keras.layers.Flatten()] + [
        keras.layers.Dense(n, activation="tanh", name=f"fc{i + 1}") for i, n in enumerate(units)
    ]


class CenterFrames(keras.layers.Layer):
    """Subtracts from each frame of each observation its mean pixel: [B, H, W, C] -> the same
    shape, each [b, :, :, c] slice with mean 0 (computed in float32 whatever the dtype).

    Why: frames scaled to [0, 1] are all non-negative, so the gradient of a first-layer filter's
    weights is a sum of non-negative inputs times one error per position, and under Adam's
    sign-like steps the filter's weights tend to move together; once the bias and the weights
    are negative enough, the unit is negative on every frame and never gets a gradient again
    (README, "First layers"). Centered inputs take both signs.

    Example: a 1x2 frame [0.2, 0.6] becomes [-0.2, 0.2].
    """

    def call(self, x):
        if x.dtype == tf.float32:
            return x - tf.reduce_mean(x, axis=[1, 2], keepdims=True)  # [B, 1, 1, C]
        return _center_in_float32(x)


class FrameOffset(keras.layers.Layer):
    """Subtracts one number from every pixel: the game's background (its most common pixel
    value), measured once at the start of a run (`set_frame_offsets`; 0 until then), kept in
    checkpoints and exports.

    Why: a game's background is most of its screen. On a black one (Breakout, Space Invaders,
    Q*bert, BeamRider) frames in [0, 1] are 0 but for the objects, and A2C learns at once. On a
    gray one (Pong: 0.34) each first-layer filter's gradient is dominated by that constant, and
    A2C stayed flat for millions of frames. Shifting a black background below 0 (each frame's
    mean, `CenterFrames`, or the game's mean pixel) left A2C's critic constant on Breakout.
    Subtracting the background makes it 0 in every game: black games are unchanged.

    Example: with offset 0.4, a 1x2 frame [0.2, 0.6] becomes [-0.2, 0.2].
    """

    def build(self, input_shape):
        self.offset = self.add_weight(shape=(), initializer="zeros", trainable=False, name="offset")

    def call(self, x):
        return x - tf.cast(self.offset, x.dtype)


def set_frame_offsets(models, pixel: float) -> bool:
    """Sets the `FrameOffset` of each model's torso to `pixel` (in [0, 1]) where it is still 0
    (a new run; a resumed one keeps its own). True if any was set."""
    done = False
    for model in models:
        for layer in getattr(getattr(model, "torso", None), "layers", []):
            if isinstance(layer, FrameOffset) and float(layer.offset.numpy()) == 0.0:
                layer.offset.assign(pixel)
                done = True
    return done


def _first_layers(center_frames: bool, subtract_background: bool = False) -> list:
    layers = [CenterFrames(name="center_frames")] if center_frames else []
    return layers + ([FrameOffset(name="frame_offset")] if subtract_background else [])


# The gain of orthogonal initialization before a ReLU (Saxe et al., 2014; the value OpenAI
# baselines and CleanRL give their Atari torsos).
RELU_GAIN = float(np.sqrt(2.0))


def kernel_initializer(orthogonal: bool, gain: float = RELU_GAIN):
    """Keras's default (Glorot uniform) or an orthogonal matrix times `gain`; biases stay zero."""
    return keras.initializers.Orthogonal(gain) if orthogonal else "glorot_uniform"


def _relu_layers(specs, orthogonal_init: bool) -> list[keras.layers.Layer]:
    """Conv2D for (name, filters, kernel, stride) and Dense for (name, units), each with ReLU."""
    layers = []
    for name, *shape in specs:
        init = kernel_initializer(orthogonal_init)
        if len(shape) == 1:
            layers += [keras.layers.Flatten(name="flatten")]
            layers += [keras.layers.Dense(shape[0], "relu", name=name, kernel_initializer=init)]
        else:
            filters, kernel, stride = shape
            layers += [
                keras.layers.Conv2D(
                    filters, kernel, stride, activation="relu", name=name, kernel_initializer=init
                )
            ]
    return layers


def a3c_torso(
    center_frames: bool = False, orthogonal_init: bool = False, subtract_background: bool = False
) -> list:
    """New layers of the A3C torso (each call builds fresh ones: the DQN learner calls it twice,
    for the network and its target). A torso maps floats in [0, 1], [B, H, W, C], to features
    [B, F]; any such factory can replace it (`train.torso`, see docs/extending.md).

    Args:
        center_frames: subtract each frame's mean pixel before the first convolution
            (`CenterFrames`; off in the papers, which feed frames in [0, 1]).
        orthogonal_init: orthogonal kernels with gain sqrt(2) (OpenAI baselines, CleanRL), in
            place of Keras's Glorot uniform (the papers do not say theirs).
        subtract_background: subtract the game's background pixel, measured at the run's
            start (`FrameOffset`; not in the papers).
    """
    specs = [("conv1", 16, 8, 4), ("conv2", 32, 4, 2), ("fc", 256)]
    layers = _first_layers(center_frames, subtract_background)
    return layers + _relu_layers(specs, orthogonal_init)


def nature_torso(
    center_frames: bool = False, orthogonal_init: bool = False, subtract_background: bool = False
) -> list:
    """New layers of the Nature DQN torso (the contract and the options of `a3c_torso`)."""
    specs = [("conv1", 32, 8, 4), ("conv2", 64, 4, 2), ("conv3", 64, 3, 1), ("fc", 512)]
    layers = _first_layers(center_frames, subtract_background)
    return layers + _relu_layers(specs, orthogonal_init)


def _build_torso(torso: keras.Sequential, input_shape, name: str, spec: EnvSpec) -> tuple:
    """Builds `torso` on `input_shape`; its output shape.

    Raises:
        ValueError: the torso cannot take the env's observations (naming both, and what fits).
    """
    try:
        torso.build(input_shape)
        return torso.compute_output_shape(input_shape)
    except ValueError as error:
        first = str(error).strip().splitlines()[0].rstrip(".")
        dtype = np.dtype(spec.observation.dtype).name
        raise ValueError(
            f"the torso {name} does not fit this env's observations "
            f"({dtype} {list(spec.observation.shape)}): {first}; frames "
            "[H, W, C] take a3c_torso (from 20x20) or nature_torso (from 36x36), vectors [D] "
            "take mlp_torso"
        ) from None


@gin.configurable(module="tfaccel", allowlist=["orthogonal_init"])
class PolicyValueNetwork(keras.Model):
    """Policy logits [B, A] and state value [B] over a shared torso."""

    def __init__(self, spec: EnvSpec, torso=a3c_torso, orthogonal_init: bool = False, **kwargs):
        """Args:
        spec: the env's spec (observation shape, number of actions).
        torso: a factory of the torso's layers, e.g. `a3c_torso`.
        orthogonal_init: orthogonal head kernels, gain 0.01 for the policy (a near-uniform
            first policy) and 1 for the value, as OpenAI baselines and CleanRL; else Glorot.
        """
        super().__init__(**kwargs)
        self.spec = spec
        self.torso = keras.Sequential(torso(), name="torso")
        self._torso_name = getattr(torso, "__name__", type(torso).__name__)
        self.policy_head = keras.layers.Dense(
            spec.num_actions,
            name="logits",
            dtype="float32",
            kernel_initializer=kernel_initializer(orthogonal_init, gain=0.01),
        )
        self.value_head = keras.layers.Dense(
            1,
            name="value",
            dtype="float32",
            kernel_initializer=kernel_initializer(orthogonal_init, 1.0),
        )
        self.build((None, *spec.observation.shape))

    def build(self, input_shape):
        features = _build_torso(self.torso, input_shape, self._torso_name, self.spec)
        self.policy_head.build(features)
        self.value_head.build(features)
        self.built = True

    def call(self, observation):
        x = _scaled(observation, self.compute_dtype)  # [B, H, W, C], or [B, D]
        features = self.torso(x)  # [B, F]
        return self.policy_head(features), tf.squeeze(self.value_head(features), -1)


class QNetwork(keras.Model):
    """Action values over a torso: scalar Q [B, A], or a categorical distribution per action.

    - `num_atoms == 1`: `call` returns `q_values` [B, A] (DQN, Mnih et al., 2015).
    - `num_atoms > 1`: `call` returns `logits` [B, A, N] of a categorical distribution over the
      N atoms of a fixed support per action (C51, Bellemare et al., 2017); probabilities are the
      softmax over the last axis. The support (v_min, v_max) belongs to the algorithm's config.
    - `dueling` (Wang et al., 2016): a value stream V [B, 1(, N)] and an advantage stream
      A [B, A(, N)], combined as `Q = V + A - mean_a A`; in the categorical case the combination
      is applied to the logits per atom, as in Rainbow (Hessel et al., 2018). Difference from
      Wang et al.: both streams are linear heads on the torso's shared last hidden layer, where
      they give each stream its own hidden layer (FC 512).
    """

    def __init__(
        self,
        spec: EnvSpec,
        torso=nature_torso,
        dueling: bool = False,
        num_atoms: int = 1,
        **kwargs,
    ):
        """Args:
        spec: the env's spec (observation shape, number of actions).
        torso: a factory of the torso's layers, e.g. `nature_torso` or `a3c_torso`.
        dueling: split the head into value and advantage streams.
        num_atoms: 1 for scalar Q values, N > 1 (51 for C51) for a distribution per action.
        """
        super().__init__(**kwargs)
        self.spec = spec
        self.dueling = dueling
        self.num_atoms = int(num_atoms)
        self.torso = keras.Sequential(torso(), name="torso")
        self._torso_name = getattr(torso, "__name__", type(torso).__name__)
        self.advantage_head = keras.layers.Dense(
            spec.num_actions * self.num_atoms, name="advantage" if dueling else "q", dtype="float32"
        )
        self.value_head = (
            keras.layers.Dense(self.num_atoms, name="value", dtype="float32") if dueling else None
        )
        self.build((None, *spec.observation.shape))

    def build(self, input_shape):
        features = _build_torso(self.torso, input_shape, self._torso_name, self.spec)
        self.advantage_head.build(features)
        if self.value_head is not None:
            self.value_head.build(features)
        self.built = True

    def call(self, observation):
        x = _scaled(observation, self.compute_dtype)  # [B, H, W, C], or [B, D]
        features = self.torso(x)  # [B, F]
        shape = [-1, self.spec.num_actions, self.num_atoms]
        head = tf.reshape(self.advantage_head(features), shape)  # [B, A, N]
        if self.value_head is not None:
            value = self.value_head(features)[:, None, :]  # [B, 1, N]
            head = value + head - tf.reduce_mean(head, axis=1, keepdims=True)  # [B, A, N]
        if self.num_atoms == 1:
            return head[..., 0]  # [B, A] q_values
        return head  # [B, A, N] logits
