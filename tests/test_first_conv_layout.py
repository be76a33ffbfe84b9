"""benchmarks/first_conv_layout.py: the folded layout computes the first layer's outputs."""

import os
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import first_conv_layout as layout  # noqa: E402


def test_the_folded_kernel_puts_each_weight_where_the_fold_puts_its_pixel():
    # One weight at kernel row 5, column 2, frame 3: after the fold it is tap (1, 0) (5 // 4,
    # 2 // 4) and channel (5 % 4) * 16 + (2 % 4) * 4 + 3 = 27.
    kernel = np.zeros([8, 8, 4, 1], np.float32)
    kernel[5, 2, 3, 0] = 1.0
    folded = layout.folded_kernel(tf.constant(kernel)).numpy()
    assert folded.shape == (2, 2, 64, 1)
    assert np.argwhere(folded).tolist() == [[1, 0, 27, 0]]


def test_both_layouts_give_the_same_outputs_and_gradients():
    rng = np.random.default_rng(0)
    kernel = tf.Variable(rng.normal(0, 0.05, [8, 8, 4, 3]).astype(np.float32))
    bias = tf.Variable(rng.normal(0, 0.05, [3]).astype(np.float32))
    frames = tf.constant(rng.integers(0, 256, (2, 104, 80, 4), np.uint8))
    direct = layout.layer(kernel, bias, tf.float32, fold=False)
    folded = layout.layer(kernel, bias, tf.float32, fold=True)
    out = direct[0](frames).numpy()
    assert out.shape == (2, 25, 19, 3) and (out > 0).any()
    np.testing.assert_allclose(folded[0](frames).numpy(), out, atol=1e-5)
    for a, b in zip(direct[1](frames), folded[1](frames), strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-3)
