"""`ops.huber` and `ops.categorical_projection` against slow numpy versions and their docstrings."""

import numpy as np
import pytest

from tfaccel import ops


def numpy_huber(x, delta):
    out = np.zeros(len(x))
    for i, error in enumerate(x):
        if abs(error) <= delta:
            out[i] = 0.5 * error**2
        else:
            out[i] = delta * (abs(error) - 0.5 * delta)
    return out


def numpy_categorical_projection(support, next_probabilities, reward, discount):
    """Bellemare et al. (2017), Algorithm 1, one transition and one atom at a time."""
    num_atoms = len(support)
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (num_atoms - 1)
    out = np.zeros((len(reward), num_atoms))
    for b in range(len(reward)):
        for j in range(num_atoms):
            target_z = min(max(reward[b] + discount[b] * support[j], v_min), v_max)
            position = (target_z - v_min) / delta_z
            lower, upper = int(np.floor(position)), int(np.ceil(position))
            if lower == upper:  # lands on an atom
                out[b, lower] += next_probabilities[b, j]
            else:
                out[b, lower] += next_probabilities[b, j] * (upper - position)
                out[b, upper] += next_probabilities[b, j] * (position - lower)
    return out


def test_huber_docstring_example():
    np.testing.assert_allclose(
        ops.huber([-3.0, -0.5, 0.0, 1.0, 2.0]).numpy(), [2.5, 0.125, 0.0, 0.5, 1.5]
    )


@pytest.mark.parametrize("delta", [0.5, 1.0, 3.0])
def test_huber_matches_numpy(delta):
    x = np.random.default_rng(0).normal(scale=3.0, size=50).astype(np.float32)
    np.testing.assert_allclose(ops.huber(x, delta).numpy(), numpy_huber(x, delta), rtol=1e-5)


def test_categorical_projection_docstring_example():
    support = np.array([0.0, 1.0, 2.0], np.float32)
    probabilities = np.array([[0.2, 0.3, 0.5]] * 3, np.float32)
    reward = np.array([0.5, 1.25, 5.0], np.float32)
    discount = np.array([0.5, 0.0, 0.0], np.float32)
    projected = ops.categorical_projection(support, probabilities, reward, discount).numpy()
    np.testing.assert_allclose(
        projected, [[0.1, 0.65, 0.25], [0.0, 0.75, 0.25], [0.0, 0.0, 1.0]], atol=1e-6
    )


@pytest.mark.parametrize("num_atoms", [3, 11, 51])
def test_categorical_projection_matches_numpy(num_atoms):
    rng = np.random.default_rng(num_atoms)
    batch = 64
    support = np.linspace(-10.0, 10.0, num_atoms).astype(np.float32)
    logits = rng.normal(size=(batch, num_atoms))
    probabilities = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    reward = rng.uniform(-12.0, 12.0, batch).astype(np.float32)  # some beyond the support
    discount = rng.choice([0.0, 0.9, 0.99**3, 1.0], batch).astype(np.float32)
    projected = ops.categorical_projection(support, probabilities, reward, discount).numpy()
    expected = numpy_categorical_projection(support, probabilities, reward, discount)
    np.testing.assert_allclose(projected, expected, atol=1e-5)
    np.testing.assert_allclose(projected.sum(-1), 1.0, atol=1e-5)  # mass is conserved
    assert (projected >= 0.0).all()


def test_categorical_projection_clips_at_the_support_edges():
    support = np.linspace(-1.0, 1.0, 5).astype(np.float32)
    probabilities = np.full((2, 5), 0.2, np.float32)
    reward = np.array([3.0, -3.0], np.float32)
    discount = np.array([1.0, 1.0], np.float32)  # every shifted atom lies beyond an edge
    projected = ops.categorical_projection(support, probabilities, reward, discount).numpy()
    np.testing.assert_allclose(projected, [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0]], atol=1e-6)


def test_categorical_projection_terminal_puts_mass_around_the_reward():
    support = np.linspace(-10.0, 10.0, 51).astype(np.float32)  # dz = 0.4
    probabilities = np.random.default_rng(1).dirichlet(np.ones(51), 2).astype(np.float32)
    reward = np.array([1.0, 1.2], np.float32)  # 1.2 is an atom (index 28); 1.0 lies 2.5 dz up
    discount = np.zeros(2, np.float32)
    projected = ops.categorical_projection(support, probabilities, reward, discount).numpy()
    expected = np.zeros((2, 51))
    expected[0, 27], expected[0, 28] = 0.5, 0.5  # 1.0 is halfway between 0.8 and 1.2
    expected[1, 28] = 1.0
    np.testing.assert_allclose(projected, expected, atol=1e-5)


def test_categorical_projection_identity_when_target_is_the_support():
    support = np.linspace(-2.0, 2.0, 9).astype(np.float32)
    probabilities = np.random.default_rng(2).dirichlet(np.ones(9), 4).astype(np.float32)
    projected = ops.categorical_projection(
        support, probabilities, np.zeros(4, np.float32), np.ones(4, np.float32)
    ).numpy()
    np.testing.assert_allclose(projected, probabilities, atol=1e-6)
