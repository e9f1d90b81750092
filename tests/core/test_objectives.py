"""Each objective's loss, closed-form gradient and residual against independent formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import expit, log_softmax

import polarize as pz

DIM, SAMPLES = 5, 7
# the names for parametrize, without drawing the objectives while every worker collects
NAMES = ("logistic-direction", "logistic-data", "square", "cross-entropy")


def beta(scale, seed=0):
    return scale * np.random.default_rng(seed).standard_normal(DIM)


def objectives():
    drawn = {
        "logistic-direction": pz.random_direction(1, DIM),
        "logistic-data": pz.random_labels(2, SAMPLES, DIM),
        "square": pz.conditioned_regression(3, SAMPLES, DIM, 3.0),
        "cross-entropy": pz.peaked_distribution(4, DIM),
    }
    assert tuple(drawn) == NAMES
    return drawn


def numpy_loss(name, obj, b):
    """The losses written with numpy and scipy.special only."""
    if name == "logistic-direction":
        return np.logaddexp(0.0, -np.asarray(obj.b) @ b)
    if name == "logistic-data":
        return np.mean(np.logaddexp(0.0, -np.asarray(obj.y) * (np.asarray(obj.X) @ b)))
    if name == "square":
        return np.sum((np.asarray(obj.y) - np.asarray(obj.X) @ b) ** 2)
    return -np.sum(np.asarray(obj.p) * log_softmax(b))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.5, 50.0])  # large margins: no overflow in log(1 + exp(.))
def test_loss_matches_numpy(name, scale):
    obj, b = objectives()[name], beta(scale)
    np.testing.assert_allclose(obj(b), numpy_loss(name, obj, b), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [0.5, 50.0])
def test_closed_form_gradient_equals_autodiff(name, scale):
    obj, b = objectives()[name], beta(scale)
    np.testing.assert_allclose(obj.grad(b), jax.grad(obj)(b), rtol=1e-10, atol=1e-14)


def test_residuals_match_their_formulas():
    objs, z = objectives(), np.random.default_rng(1).standard_normal(SAMPLES)
    data, square = objs["logistic-data"], objs["square"]
    y = np.asarray(data.y)
    np.testing.assert_allclose(data.residual(z), y * expit(-y * z) / SAMPLES, rtol=1e-12)
    np.testing.assert_allclose(square.residual(z), 2 * (np.asarray(square.y) - z), rtol=1e-12)
    np.testing.assert_allclose(objs["logistic-direction"].residual(z[0]), expit(-z[0]), rtol=1e-12)


def test_loss_of_the_margin_matches_the_loss_of_beta():
    """l(m) for an objective of one direction: log(1 + e^-m) (numpy), and the default,
    the loss of beta = b m / |b|^2, for a direction of any length."""
    obj = objectives()["logistic-direction"]
    margins = np.array([-30.0, -1.5, 0.0, 0.7, 40.0])
    for m in margins:
        np.testing.assert_allclose(obj.of_margin(m), np.logaddexp(0.0, -m), rtol=1e-13)

    class Scaled(pz.AbstractObjective):  # l(<b, beta>) with |b| = 2, no l written
        core_ndim = {}

        def __call__(self, beta):
            return jnp.cosh(jnp.dot(jnp.array([2.0, 0.0, 0.0]), beta) - 1.0)

        def direction(self):
            return jnp.array([2.0, 0.0, 0.0])

    for m in margins[1:4]:
        np.testing.assert_allclose(Scaled().of_margin(m), np.cosh(m - 1.0), rtol=1e-13)


def test_cross_entropy_minimum_is_the_entropy_of_p():
    """L(log p) = H(p): the value at the optimum, an identity independent of the code."""
    obj = objectives()["cross-entropy"]
    p = np.asarray(obj.p)
    np.testing.assert_allclose(obj(np.log(p)), -np.sum(p * np.log(p)), rtol=1e-12)
    np.testing.assert_allclose(obj.grad(np.log(p)), 0.0, atol=1e-14)


def test_curvature_bounds_the_hessian():
    """`curvature()` (which picks the stiff default's horizon) against jax.hessian: exact for
    the square loss, an upper bound that is attained within 2x for cross-entropy."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(5, 4)), rng.normal(size=5)
    square = pz.Square(X, y)
    top = np.linalg.eigvalsh(np.asarray(jax.hessian(square)(jnp.zeros(4)))).max()
    np.testing.assert_allclose(float(square.curvature()), top, rtol=1e-12)
    ce = pz.CrossEntropy(jnp.asarray([0.7, 0.2, 0.1]))
    tops = [
        np.linalg.eigvalsh(np.asarray(jax.hessian(ce)(jnp.asarray(rng.normal(size=3) * 2)))).max()
        for _ in range(200)
    ]
    assert max(tops) <= float(ce.curvature()) + 1e-12
    assert max(tops) > 0.5 * float(ce.curvature())


@pytest.mark.parametrize("n, dim", [(300, 5), (40, 40)])
def test_conditioned_regression_has_its_condition_number_by_either_svd(n, dim, monkeypatch):
    """Past `SVD_TALL_ROWS` samples the SVD comes from the data's transpose (JAX's CPU SVD
    would hold an n x n U); X = U diag(sv) W^T is the same matrix to rounding, since a
    singular pair's common sign flip cancels in it, and its singular values are sv."""
    from polarize.core import _objectives

    direct = pz.conditioned_regression(4, n, dim, 7.0)
    monkeypatch.setattr(_objectives, "SVD_TALL_ROWS", 16)
    transposed = pz.conditioned_regression(4, n, dim, 7.0)
    X = np.asarray(transposed.X)
    np.testing.assert_allclose(X, direct.X, rtol=0, atol=100 * np.finfo(float).eps * np.abs(X).max())
    np.testing.assert_array_equal(transposed.y, direct.y)
    s = np.linalg.svd(X, compute_uv=False)  # numpy's LAPACK: an independent check
    np.testing.assert_allclose(s, np.linspace(1.0, 1.0 / 7.0, min(n, dim)), rtol=1e-13)
    # the curvature 2 sigma_max^2 by the same route (a thin SVD of X^T past the cut-off)
    np.testing.assert_allclose(float(transposed.curvature()), 2 * s[0] ** 2, rtol=1e-13)


def test_random_labels_are_a_teachers_signs_in_one_program(compiles):
    """The labels y = sign(<w, x>) are one program, not three small ones op by op (a shape
    no other test draws), and a separating direction exists: the data are linearly
    separable through the origin, which labels by any other rule would not be."""
    data, compiled = compiles.counting(pz.random_labels, 3, 37, 5)
    assert "jit(_teacher_labels)" in compiled, compiled
    assert not {"jit(matmul)", "jit(greater_equal)", "jit(_where)"} & set(compiled), compiled
    X, y = np.asarray(data.X), np.asarray(data.y)
    assert set(np.unique(y)) == {-1.0, 1.0}
    # the teacher w separates: a hard-margin problem on (X, y) is feasible, so the
    # perceptron converges (it cycles forever on labels that no w through 0 separates)
    w = np.zeros(5)
    for _ in range(10_000):
        wrong = np.flatnonzero(y * (X @ w) <= 0)
        if wrong.size == 0:
            break
        w += y[wrong[0]] * X[wrong[0]]
    assert np.all(y * (X @ w) > 0)
