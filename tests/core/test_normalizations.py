"""Each normalization against a direct numpy formula, and its Jacobian products against jacfwd."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz


def reference(name: str, a: np.ndarray) -> np.ndarray:
    """Textbook formulas, written independently of the library (one vector)."""
    T = a.size
    if name == "softmax":
        e = np.exp(a - a.max())
        return e / e.sum()
    if name == "softmax1":
        e = np.exp(a)
        return e / (1.0 + e.sum())
    if name == "sigmoid":
        return 1 / (1 + np.exp(-a))
    if name == "relu":
        return np.maximum(a, 0)
    if name == "linear":
        return a.copy()
    if name == "sparsemax":
        # bisection on the threshold: sum(max(a - tau, 0)) = 1
        lo, hi = a.min() - 1, a.max()
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.maximum(a - mid, 0).sum() > 1 else (lo, mid)
        return np.maximum(a - (lo + hi) / 2, 0)
    h = {
        "relu-norm": np.maximum(a, 0),
        "sum-norm": a,
        "l1-norm": np.abs(a),
        "square-norm": a**2,
        "sigmoid-norm": 1 / (1 + np.exp(-a)),
    }[name]
    return h / h.sum() if h.sum() != 0 else np.full(T, 1 / T)


NAMES = list(pz.NORMALIZATIONS)


@pytest.fixture
def logits():
    return np.array([0.3, -1.2, 0.8, 0.05, 2.0, -0.4])


@pytest.mark.parametrize("name", NAMES)
def test_matches_reference_formula(name, logits):
    got = pz.normalization(name)(jnp.asarray(logits))
    np.testing.assert_allclose(got, reference(name, logits), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_batched_equals_rows(name):
    a = jax.random.normal(jax.random.key(0), (5, 7))
    norm = pz.normalization(name)
    np.testing.assert_allclose(norm(a), np.stack([norm(row) for row in a]), rtol=1e-14, atol=0)
    np.testing.assert_allclose(jax.vmap(norm)(a), norm(a), rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_jvp_and_closed_form_vjp_match_jacfwd(name, logits):
    norm = pz.normalization(name)
    a = jnp.asarray(logits)
    J = jax.jacfwd(norm)(a)
    key_t, key_c = jax.random.split(jax.random.key(1))
    tangent = jax.random.normal(key_t, a.shape)
    cotangent = jax.random.normal(key_c, a.shape)
    _, jvp = jax.jvp(norm, (a,), (tangent,))
    np.testing.assert_allclose(jvp, J @ tangent, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(norm.vjp(a, cotangent), J.T @ cotangent, rtol=1e-10, atol=1e-12)
    # and against central finite differences, independent of autodiff
    eps = 1e-6
    fd = (norm(a + eps * tangent) - norm(a - eps * tangent)) / (2 * eps)
    np.testing.assert_allclose(jvp, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "name, a",
    [
        ("relu-norm", [-1.0, -2.0, 0.0]),
        ("l1-norm", [0.0, 0.0, 0.0]),
        ("square-norm", [0.0, 0.0, 0.0]),
        ("sum-norm", [1.0, -1.0, 0.0]),
    ],
)
def test_zero_denominator_is_uniform_with_finite_gradient(name, a):
    norm = pz.normalization(name)
    a = jnp.asarray(a)
    np.testing.assert_allclose(norm(a), np.full(3, 1 / 3))
    J = jax.jacrev(norm)(a)
    assert np.all(np.isfinite(J))
    assert np.all(np.isfinite(norm.vjp(a, jnp.ones(3))))


@pytest.mark.parametrize("name", [n for n, c in pz.NORMALIZATIONS.items() if c.simplex])
def test_simplex_normalizations_sum_to_one(name):
    a = jax.random.normal(jax.random.key(2), (20, 9))
    s = pz.normalization(name)(a)
    np.testing.assert_allclose(jnp.sum(s, -1), 1.0, rtol=1e-12)
    assert np.all(s >= 0)


def test_temperature_and_sink_options():
    a = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(pz.Softmax(temperature=0.5)(a), reference("softmax", 2 * np.asarray(a)))
    s = pz.Softmax1(sink=2.0)(a)
    np.testing.assert_allclose(s, np.exp(a) / (np.exp(2.0) + np.exp(a).sum()), rtol=1e-12)
    assert float(jnp.sum(s)) < 1


def test_registry_errors_name_the_choices():
    with pytest.raises(pz.PolarizeError, match=r"`norm` must be one of softmax, .*sparsemax; got 'softmaxx'"):
        pz.normalization("softmaxx")
    with pytest.raises(pz.PolarizeError, match="`temperature` must be a positive finite number"):
        pz.normalization("softmax", temperature=0.0)
    with pytest.raises(pz.PolarizeError, match="takes options"):
        pz.normalization("sigmoid", temperature=2.0)
