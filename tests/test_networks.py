"""How the networks prepare frames (scaled to [0, 1]) and the torsos' option to center each
frame (`center_frames`): its math, what the network then ignores, the same variables as without
it, the gin binding, and its SavedModel."""

import json

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import export, networks, runner, trainers  # noqa: F401 (trainers registers the torsos)
from tfaccel.envs.atari import AtariConfig
from tfaccel.networks import CenterFrames, PolicyValueNetwork, QNetwork
from tfaccel.types import ArraySpec, EnvSpec

SPEC = EnvSpec(ArraySpec((104, 80, 4), np.uint8), 6)
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}  # a layer's policy per dtype


def observations(n=8, seed=0):
    """uint8 frames in [20, 200), so that adding a constant up to 50 stays in range."""
    return np.random.default_rng(seed).integers(20, 200, (n, 104, 80, 4), dtype=np.uint8)


def test_center_frames_worked_example():
    frame = tf.constant([[[[0.2], [0.6]]]])  # [B=1, H=1, W=2, C=1]
    np.testing.assert_allclose(CenterFrames()(frame).numpy().ravel(), [-0.2, 0.2], atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("compiled", [False, True])  # in a graph, oneDNN may pick other kernels
def test_every_frame_of_every_observation_has_mean_zero(dtype, compiled):
    frames = np.random.default_rng(3).integers(0, 256, (3, 104, 80, 4)) / 255.0
    layer = CenterFrames(dtype=POLICIES[dtype])
    centered = (tf.function(layer) if compiled else layer)(tf.cast(frames, dtype))
    assert centered.dtype == dtype  # computed in that dtype, not cast back to float32 by Keras
    centered = tf.cast(centered, tf.float32)
    expected = frames - frames.mean(axis=(1, 2), keepdims=True)
    tolerance = 1e-5 if dtype == "float32" else 1e-2  # bfloat16 keeps 8 bits of mantissa
    np.testing.assert_allclose(centered.numpy(), expected, atol=tolerance)
    assert np.abs(centered.numpy().mean(axis=(1, 2))).max() < tolerance


# Odd, small, square (84x84, the usual Atari size) and Pong's 104x80 frames, three channels.
@pytest.mark.parametrize("height, width", [(3, 5), (6, 4), (84, 84), (104, 80)])
def test_float32_frames_of_any_size_are_centered_as_numpy_does(height, width):
    frames = np.random.default_rng(height).uniform(0, 1, (2, height, width, 3)).astype(np.float32)
    centered = tf.function(CenterFrames())(tf.constant(frames)).numpy()
    expected = frames - frames.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(centered, expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_frames_of_unknown_size_are_centered_alike(dtype):
    x = tf.cast(observations(2) / 255.0, dtype)
    layer = CenterFrames(dtype=POLICIES[dtype])
    unknown = tf.function(layer, input_signature=[tf.TensorSpec([None, None, None, 4], dtype)])
    np.testing.assert_array_equal(unknown(x).numpy(), layer(x).numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_frames_are_scaled_to_the_unit_interval_and_other_inputs_pass_as_they_are(dtype):
    frames = np.array([[0, 1, 128, 254, 255]], np.uint8)
    scaled = networks._scaled(tf.constant(frames), dtype)
    assert scaled.dtype == dtype
    tolerance = 1e-7 if dtype == "float32" else 2e-3  # bfloat16: half a step of 8 bits at 1.0
    np.testing.assert_allclose(tf.cast(scaled, tf.float32).numpy(), frames / 255.0, atol=tolerance)
    vector = networks._scaled(tf.constant([[3.0, -2.0]]), dtype)
    np.testing.assert_array_equal(tf.cast(vector, tf.float32).numpy(), [[3.0, -2.0]])


@pytest.mark.parametrize("network_class", [PolicyValueNetwork, QNetwork])
@pytest.mark.parametrize("torso", [networks.a3c_torso, networks.nature_torso])
def test_a_centered_network_ignores_a_frames_brightness(network_class, torso):
    keras.utils.set_random_seed(0)
    brighter = observations().copy()
    brighter[..., 2] += 50  # one frame of the stack, every pixel
    for center, same in ((True, True), (False, False)):
        network = network_class(SPEC, torso=lambda c=center: torso(center_frames=c))
        first, second = network(observations()), network(brighter)
        first, second = tf.nest.flatten(first), tf.nest.flatten(second)
        close = all(np.allclose(a, b, atol=1e-5) for a, b in zip(first, second, strict=True))
        assert close == same, f"center_frames={center}"


def test_centering_adds_no_variables():
    """The same variables in the same order: the option changes the function, not the weights
    (an optimizer's slots, which follow that order, line up)."""
    plain = PolicyValueNetwork(SPEC, torso=networks.a3c_torso)
    centered = PolicyValueNetwork(SPEC, torso=lambda: networks.a3c_torso(center_frames=True))
    shapes = [tuple(w.shape) for w in plain.trainable_weights]
    assert shapes == [tuple(w.shape) for w in centered.trainable_weights]
    assert len(plain.weights) == len(centered.weights) == 10  # 2 conv, fc, 2 heads; kernel + bias
    assert [type(layer).__name__ for layer in centered.torso.layers][:2] == [
        "CenterFrames",
        "Conv2D",
    ]


def test_the_gin_binding_reaches_the_torso():
    gin.clear_config()
    try:
        gin.parse_config("a3c_torso.center_frames = True")
        layers = gin.get_configurable("a3c_torso")()
        assert isinstance(layers[0], CenterFrames)
    finally:
        gin.clear_config()
    assert not isinstance(gin.get_configurable("a3c_torso")()[0], CenterFrames)


@pytest.mark.parametrize("torso", [networks.a3c_torso, networks.nature_torso])
def test_orthogonal_init_gives_orthogonal_kernels_with_the_relu_gain(torso):
    """Each kernel, flattened to [inputs, units], has orthogonal columns of squared norm 2 (gain
    sqrt 2); Glorot's columns are neither (their squared norms are near 2 / (1 + units/inputs))."""
    layers = torso(orthogonal_init=True)
    keras.Sequential(layers).build((None, 104, 80, 4))
    for layer in [layer for layer in layers if hasattr(layer, "kernel")]:
        kernel = layer.kernel.numpy().reshape(-1, layer.kernel.shape[-1])  # [inputs, units]
        np.testing.assert_allclose(kernel.T @ kernel, 2.0 * np.eye(kernel.shape[1]), atol=1e-4)
        assert not layer.bias.numpy().any()
    glorot = torso()[0]
    glorot.build((None, 104, 80, 4))
    kernel = glorot.kernel.numpy().reshape(-1, glorot.kernel.shape[-1])
    assert not np.allclose(kernel.T @ kernel, 2.0 * np.eye(kernel.shape[1]), atol=0.1)


def test_orthogonal_heads_start_near_uniform_and_keep_the_variables():
    """Policy head gain 0.01: the first policy is near uniform (logits within 0.05 of each other
    on random frames, where Glorot's spread more); value head gain 1. The variables are those of
    the Glorot network, so a checkpoint of either restores into the other."""
    gin.clear_config()
    try:
        gin.parse_config("PolicyValueNetwork.orthogonal_init = True")
        orthogonal = PolicyValueNetwork(
            SPEC, torso=lambda: networks.a3c_torso(orthogonal_init=True)
        )
    finally:
        gin.clear_config()
    glorot = PolicyValueNetwork(SPEC)
    head = orthogonal.policy_head.kernel.numpy()  # [256, A]
    np.testing.assert_allclose(head.T @ head, 1e-4 * np.eye(SPEC.num_actions), atol=1e-7)
    value = orthogonal.value_head.kernel.numpy()
    np.testing.assert_allclose(value.T @ value, [[1.0]], atol=1e-5)
    logits, _ = orthogonal(observations())
    assert np.ptp(logits.numpy(), axis=1).max() < 0.05
    assert np.ptp(glorot(observations())[0].numpy(), axis=1).max() > 0.05
    assert [w.path.split("/", 1)[1] for w in orthogonal.weights] == [
        w.path.split("/", 1)[1] for w in glorot.weights
    ]


def test_a_centered_policy_exports_and_reloads(tmp_path):
    keras.utils.set_random_seed(1)
    network = PolicyValueNetwork(SPEC, torso=lambda: networks.a3c_torso(center_frames=True))
    path = str(tmp_path / "policy")
    export.export_policy(network, AtariConfig(game="pong"), path)
    served = tf.saved_model.load(path).signatures["serving_default"]
    logits = served(observation=tf.constant(observations()))["logits"]
    np.testing.assert_allclose(logits.numpy(), network(observations())[0].numpy(), atol=1e-5)


def test_auto_precision_is_bfloat16_only_where_the_hardware_computes_it():
    def choose(flags=("avx2", "fma"), gpus=(), speedup=1.9):
        return networks.choose_precision(lambda: set(flags), lambda: list(gpus), lambda: speedup)

    assert choose()[0] == "float32"
    # AVX-512 BF16 without AMX: as the measured matrix product says
    precision, why = choose(flags=("avx2", "avx512_bf16"), speedup=1.9)
    assert precision == "mixed_bfloat16" and "1.90x as fast" in why
    precision, why = choose(flags=("avx2", "avx512_bf16"), speedup=0.68)
    assert precision == "float32" and "0.68x" in why and "from 1.4x" in why
    precision, why = choose(flags=("avx2", "avx512_bf16"), speedup=float("nan"))
    assert precision == "float32" and "ran no bfloat16 product" in why
    assert choose(flags=("avx512_bf16", "amx_bf16", "amx_tile"), speedup=0.5)[0] == "mixed_bfloat16"
    assert networks.choose_precision(lambda: None, lambda: [])[0] == "float32"  # flags unknown
    turing, ampere = ("Tesla T4", (7, 5)), ("NVIDIA A100", (8, 0))
    assert choose(gpus=[ampere])[0] == "mixed_bfloat16"
    assert choose(gpus=[ampere, turing], flags=("amx_bf16",))[0] == "float32"
    assert choose(gpus=[("GPU 0", None)])[0] == "float32"  # capability not told: the safe one


def test_the_bfloat16_speedup_is_measured_once_per_process(monkeypatch, tmp_path):
    monkeypatch.delenv(networks.SPEEDUP_VARIABLE, raising=False)
    monkeypatch.setenv(networks.CACHE_VARIABLE, str(tmp_path))
    networks.bfloat16_speedup.cache_clear()
    ratio = networks.bfloat16_speedup()
    assert 0.01 < ratio < 100  # a ratio of two timings, whatever this CPU
    assert networks.bfloat16_speedup() is ratio  # kept, not measured again
    # The learners of an async run take their launcher's measurement, so they choose alike.
    bf16 = lambda: {"avx512_bf16"}  # noqa: E731
    assert networks.speedup_for_children(0, bf16) == {networks.SPEEDUP_VARIABLE: repr(ratio)}
    assert networks.speedup_for_children(1, bf16) == {}  # a GPU decides
    assert networks.speedup_for_children(0, lambda: {"avx512_bf16", "amx_bf16"}) == {}
    networks.bfloat16_speedup.cache_clear()
    monkeypatch.setenv(networks.SPEEDUP_VARIABLE, "1.25")
    assert networks.bfloat16_speedup() == 1.25
    networks.bfloat16_speedup.cache_clear()


def test_the_bfloat16_speedup_is_kept_for_the_machine_so_runs_choose_alike(monkeypatch, tmp_path):
    """A run's precision under 'auto' must not depend on how busy the machine was when it
    started: the first measurement is kept, and later processes take it."""
    monkeypatch.delenv(networks.SPEEDUP_VARIABLE, raising=False)
    monkeypatch.setenv(networks.CACHE_VARIABLE, str(tmp_path / "cache"))
    timings = iter([1.2, 2.6, 1.9])  # what a loaded and an idle machine might measure
    monkeypatch.setattr(networks, "_measure_speedup", lambda size, repeats: next(timings))

    def in_a_new_process():
        networks.bfloat16_speedup.cache_clear()
        return networks.bfloat16_speedup()

    try:
        assert in_a_new_process() == 1.2  # measured and kept
        path = networks.speedup_file()
        assert path.parent == tmp_path / "cache" and json.loads(path.read_text())["speedup"] == 1.2
        assert in_a_new_process() == 1.2  # taken, not measured: the idle 2.6 is never seen
        # Two processes that measured at once: the first to keep its figure wins.
        assert networks._keep_speedup(path, 2.6) == 1.2
        # A damaged file is measured again and replaced.
        path.write_text("{")
        assert in_a_new_process() == 2.6 and json.loads(path.read_text())["speedup"] == 2.6
        # What is not a timing ratio is no kept figure.
        for text in ('{"speedup": true}', '{"speedup": "2"}', '{"speedup": -1}', "[]",
                     '{"speedup": NaN}', '{"speedup": 1' + "0" * 400 + "}"):  # fmt: skip
            path.write_text(text)
            assert networks._read_speedup(path) is None, text
        path.write_text('{"speedup": 2.6}')
        # A cache that cannot be written (here: a file where the folder should be) still works.
        monkeypatch.setenv(networks.CACHE_VARIABLE, str(path))
        assert in_a_new_process() == 1.9
        assert list((tmp_path / "cache").iterdir()) == [path]  # no temporary file left
    finally:
        networks.bfloat16_speedup.cache_clear()


def test_the_kept_speedup_is_per_kernel_settings_and_survives_a_file_system_without_links(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(networks.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    native = networks.speedup_file()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # bfloat16 emulated: another figure
    pinned = networks.speedup_file()
    assert native != pinned and native.parent == pinned.parent == tmp_path

    def no_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(networks.os, "link", no_links)
    assert networks._keep_speedup(pinned, 0.7) == 0.7
    assert networks._read_speedup(pinned) == 0.7  # kept all the same, and readable by others
    assert pinned.stat().st_mode & 0o044 == 0o044
    assert networks._keep_speedup(pinned, 2.0) == 0.7  # the first figure still wins
    assert sorted(tmp_path.iterdir()) == [pinned]  # no temporary file left


def test_auto_says_where_the_timing_is_kept_only_where_it_is(monkeypatch, tmp_path):
    """A cache folder that is a file (or read-only) was passed over in silence: every run timed
    the product again."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv(networks.CACHE_VARIABLE, str(tmp_path / "a_file"))
    flags = lambda: {"avx512_bf16"}  # noqa: E731
    networks._keep_speedup(networks.speedup_file(), 1.27)
    precision, why = networks.choose_precision(flags, lambda: [], lambda: 1.27)
    assert precision == "float32" and why.endswith(
        f"as fast as float32 (bfloat16 from 1.4x; timed at each start: it cannot be kept in "
        f"{tmp_path}/a_file (set TFACCEL_CACHE_DIR to a folder you can write to))"
    )
    monkeypatch.setenv(networks.CACHE_VARIABLE, str(tmp_path))
    networks._keep_speedup(networks.speedup_file(), 1.27)
    precision, why = networks.choose_precision(flags, lambda: [], lambda: 1.27)
    assert precision == "float32" and "(bfloat16 from 1.4x; timed once, kept in " in why
    precision, why = networks.choose_precision(flags, lambda: [], lambda: 2.0)
    assert precision == "mixed_bfloat16" and why.endswith("2.00x as fast as float32")


def test_set_precision_says_what_it_chose_and_a_binding_overrides():
    try:
        line = networks.set_precision("auto")
        chosen = networks.choose_precision()[0]
        assert line.startswith(f"precision: {chosen} (auto: ") and "overrides" in line
        assert keras.mixed_precision.global_policy().name == chosen
        assert networks.set_precision("float32") == "precision: float32 (set_precision.policy)"
        with pytest.raises(ValueError, match="unknown precision 'half'; valid: auto, float32"):
            networks.set_precision("half")
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_bfloat16_is_flagged_where_the_machine_would_emulate_it():
    def warn(policy="mixed_bfloat16", flags=("avx2", "fma"), gpus=(), speedup=1.9):
        return networks.precision_warning(
            policy, lambda: set(flags), lambda: list(gpus), lambda: speedup
        )

    assert "without AVX-512 BF16 or AMX" in warn() and "'float32'" in warn()
    assert warn(flags=("avx2", "avx512_bf16")) is None  # a product 1.9x as fast in bfloat16
    slower = warn(flags=("avx2", "avx512_bf16"), speedup=0.68)
    assert "0.68x as fast" in slower and "'float32'" in slower
    assert warn(flags=("avx2", "avx512_bf16"), speedup=1.2) is None  # not the faster, not slower
    assert warn(flags=("avx2", "amx_bf16", "amx_tile")) is None
    assert warn(policy="float32") is None  # float32 is never emulated
    assert networks.precision_warning("mixed_bfloat16", lambda: None, lambda: []) is None  # unknown
    turing, ampere = ("Tesla T4", (7, 5)), ("NVIDIA A100", (8, 0))
    assert warn(gpus=[ampere]) is None  # the GPU does the work: the CPU's flags do not matter
    assert "Tesla T4 (7.5)" in warn(gpus=[ampere, turing], flags=("amx_bf16",))
    assert warn(gpus=[("GPU 0", None)]) is None  # capability not told: no claim


@pytest.mark.parametrize(
    "network_class, torso, shape, dtype, fits",
    [
        (QNetwork, networks.nature_torso, (36, 36, 4), np.uint8, True),
        (QNetwork, networks.nature_torso, (35, 35, 4), np.uint8, False),
        (PolicyValueNetwork, networks.a3c_torso, (20, 20, 4), np.uint8, True),
        (PolicyValueNetwork, networks.a3c_torso, (44, 19, 1), np.uint8, False),
        (PolicyValueNetwork, networks.a3c_torso, (4,), np.float32, False),
    ],
)
def test_a_torso_that_cannot_take_the_observations_names_both(
    network_class, torso, shape, dtype, fits
):
    spec = EnvSpec(ArraySpec(shape, dtype), 3)
    if fits:  # the smallest frames the message promises
        network_class(spec, torso=torso)
        return
    name = np.dtype(dtype).name
    with pytest.raises(ValueError, match=rf"torso {torso.__name__} does not fit .*\({name} \["):
        network_class(spec, torso=torso)


def test_frame_offset_worked_example_and_it_is_set_once():
    layer = networks.FrameOffset()
    frame = tf.constant([[[[0.2], [0.6]]]])  # [B=1, H=1, W=2, C=1]
    np.testing.assert_allclose(layer(frame).numpy().ravel(), [0.2, 0.6])  # 0 until measured
    network = PolicyValueNetwork(SPEC, torso=lambda: networks.a3c_torso(subtract_background=True))
    offset = network.torso.layers[0]
    assert isinstance(offset, networks.FrameOffset) and float(offset.offset.numpy()) == 0.0
    assert networks.set_frame_offsets([network], 0.4)
    np.testing.assert_allclose(offset(frame).numpy().ravel(), [-0.2, 0.2], atol=1e-7)
    assert not networks.set_frame_offsets([network], 0.9)  # a resumed run keeps its own
    assert float(offset.offset.numpy()) == pytest.approx(0.4)
    assert offset.offset in network.non_trainable_weights  # checkpointed, never trained
    assert not networks.set_frame_offsets([PolicyValueNetwork(SPEC)], 0.4)  # none to set


def test_the_background_is_the_most_common_pixel_of_random_play():
    assert runner.background_pixel(AtariConfig(game="pong"), seed=0, steps=20) == 87 / 255
    assert runner.background_pixel(AtariConfig(game="breakout"), seed=0, steps=20) == 0.0
