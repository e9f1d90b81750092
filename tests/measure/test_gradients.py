"""Gradients through `flow` and `descend` against central finite differences, loops and each other.

Finite-difference tolerance. With the checkpointed adjoint `jax.grad` is the exact
derivative of the discretized solve. Central differences of that same map, step h
relative to each input, differ from it by O(h^2) truncation (~1e-10 at h = 1e-5)
plus rounding/h (~1e-11) as long as the solver accepts the same pattern of steps at
x - h and x + h; when the pattern changes the map jumps by about the local error,
rtol * |y| ~ 1e-10, i.e. ~1e-5 after division by h, an upper bound rarely reached.
Hence the check |grad - fd| <= 1e-6 + 1e-5 |grad|, far below the O(1) relative errors
of a missing or wrong term.

Every test uses the same sizes (tokens, dim, samples, save grid, tolerances), so the
compiled programs are shared; the full objective x normalization product is `slow`.
"""

import functools

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import polarize as pz
from polarize.measure._grads import final_entropy, final_loss

TOKENS, DIM, SAMPLES = 3, 2, 4
SOLVE = dict(n_save=2, rtol=1e-10, atol=1e-12)
HORIZON = 20.0
FD_STEP = 1e-5
FD_RTOL, FD_ATOL = 1e-5, 1e-6


LABELS = pz.random_labels(2, SAMPLES, DIM).y


def objective_arrays(name: str) -> dict:
    if name == "logistic-direction":
        return {"b": pz.random_direction(1, DIM).b}
    if name == "logistic-data":  # labels are discrete (+-1, checked under jit too): not an input
        return {"X": pz.random_labels(2, SAMPLES, DIM).X}
    if name == "square":
        return {"X": pz.conditioned_regression(3, SAMPLES, DIM, 2.0).X, "y": jnp.array([0.5, -0.3, 0.8, 0.1])}
    return {"p": pz.peaked_distribution(4, DIM, 3.0).p}


#: name -> objective built from its (differentiable) arrays
OBJECTIVES = {
    "logistic-direction": lambda x: pz.LogisticDirection(x["b"]),
    "logistic-data": lambda x: pz.LogisticData(x["X"], LABELS),
    "square": lambda x: pz.Square(x["X"], x["y"]),
    "cross-entropy": lambda x: pz.CrossEntropy(x["p"]),
}
#: name -> (parameter value or None, normalization built from it)
NORMS = {
    "softmax": (1.3, lambda c: pz.Softmax(temperature=c)),
    "softmax1": (0.5, lambda c: pz.Softmax1(sink=c)),
    "sigmoid": (None, lambda c: pz.Sigmoid()),
}
#: The pairs run by default here; the rest are `slow`. Square and cross-entropy run through
#: the stiff default, whose gradient is checked (cross-entropy with softmax, at t1 = 20 and
#: 1e4) by test_stiff_flow_gradient_matches_fd_until_long_after_convergence.
DEFAULT = {
    ("logistic-direction", "softmax"),
    ("logistic-data", "sigmoid"),
}


def inputs(objective: str, norm: str) -> dict:
    """Everything the statistic depends on: initial state, objective arrays, norm parameter, t1."""
    model = pz.init_ensemble(0, 1, tokens=TOKENS, dim=DIM, v_scale=0.5, a_scale=0.3)
    x = {"V": model.V[0], "a": model.a[0], "objective": objective_arrays(objective)}
    x["t1"] = jnp.asarray(HORIZON)
    if NORMS[norm][0] is not None:
        x["norm"] = jnp.asarray(NORMS[norm][0])
    return x


def statistic(objective: str, norm: str, path: str = "auto", adjoint=None):
    """x -> (final entropy + final loss, ok) of one flow; every array in x is differentiable."""

    def fn(x):
        model = pz.ValueAttention(x["V"], x["a"], NORMS[norm][1](x.get("norm")))
        obj = OBJECTIVES[objective](x["objective"])
        traj = pz.flow(model, obj, t1=x["t1"], path=path, adjoint=adjoint, **SOLVE)
        return final_entropy(traj) + final_loss(traj), traj.ok

    return fn


@functools.cache
def value_and_grad(objective: str, norm: str, path: str = "auto"):
    return jax.jit(jax.value_and_grad(statistic(objective, norm, path), has_aux=True))


@functools.cache
def value_only(objective: str, norm: str):
    """The statistic alone (forward solves only), for the finite differences."""
    return jax.jit(lambda x: statistic(objective, norm)(x)[0])


def central_differences(fn, x) -> np.ndarray:
    """(f(x + h e_i) - f(x - h e_i)) / 2h for every coordinate, h = FD_STEP max(1, |x_i|)."""
    flat, unravel = ravel_pytree(x)
    out = []
    for i in range(flat.size):
        h = FD_STEP * max(1.0, abs(float(flat[i])))
        e = jnp.zeros_like(flat).at[i].set(h)
        out.append((fn(unravel(flat + e)) - fn(unravel(flat - e))) / (2 * h))
    return np.asarray(out)


def check_against_fd(objective: str, norm: str, x: dict) -> dict:
    vg = value_and_grad(objective, norm)
    (value, ok), grad = vg(x)
    assert bool(ok) and np.isfinite(float(value))
    g = np.asarray(ravel_pytree(grad)[0])
    assert np.all(np.isfinite(g))
    fd = central_differences(lambda y: float(value_only(objective, norm)(y)), x)
    np.testing.assert_allclose(g, fd, rtol=FD_RTOL, atol=FD_ATOL)
    return grad


def pairs():
    for objective in OBJECTIVES:
        for norm in NORMS:
            marks = () if (objective, norm) in DEFAULT else pytest.mark.slow
            yield pytest.param(objective, norm, marks=marks, id=f"{objective}-{norm}")


@pytest.mark.parametrize("objective, norm", list(pairs()))
def test_flow_gradient_matches_finite_differences(objective, norm):
    """d/dx of H(t1) + L(t1) for x = V(0), a(0), the objective's arrays, the norm parameter, t1."""
    grad = check_against_fd(objective, norm, inputs(objective, norm))
    # Every kind of input really moves the statistic (so a dropped term would show).
    for name in grad:
        assert np.max(np.abs(ravel_pytree(grad[name])[0])) > 1e-6, name


def test_stiff_flow_gradient_matches_fd_until_long_after_convergence():
    """The stiff default (cross-entropy: Rosenbrock, linear clock) at t1 = 20 and t1 = 1e4.

    One compiled program for both (t1 is an input): the default cross-entropy pair of
    the test above, and the long-horizon check that tests/solve/test_stiff.py used to compile
    separately (the loss has converged long before t = 1e4; the solve is stiff there).
    """
    x = inputs("cross-entropy", "softmax")
    grad = check_against_fd("cross-entropy", "softmax", x)
    for name in grad:
        assert np.max(np.abs(ravel_pytree(grad[name])[0])) > 1e-6, name
    late = check_against_fd("cross-entropy", "softmax", x | {"t1": jnp.asarray(1e4)})
    assert np.max(np.abs(ravel_pytree(late)[0])) > 1e-3


def test_gradient_at_t1_1e6_is_finite_and_matches_fd():
    """Log-time keeps the long-horizon gradient finite and accurate (same program as t1 = 20)."""
    x = inputs("logistic-direction", "softmax") | {"t1": jnp.asarray(1e6)}
    grad = check_against_fd("logistic-direction", "softmax", x)
    assert abs(float(grad["t1"])) > 0  # still polarizing: H keeps falling, slowly


def test_save_grid_rounding_past_t1_is_not_an_error():
    """A t1 whose log1p/expm1 round trip overshoots (diffrax used to reject it) solves fine."""
    t1s = jnp.logspace(-3, 3, 20_000)
    tau = jnp.log1p(t1s)
    t1 = float(t1s[jnp.argmax(jnp.log1p(jnp.expm1(tau)) > tau)])
    x = inputs("logistic-direction", "softmax") | {"t1": jnp.asarray(t1)}
    (value, ok), grad = value_and_grad("logistic-direction", "softmax")(x)
    assert bool(ok) and np.all(np.isfinite(ravel_pytree(grad)[0]))
    model = pz.ValueAttention(x["V"], x["a"], pz.Softmax(temperature=x["norm"]))
    assert bool(pz.flow(model, pz.LogisticDirection(x["objective"]["b"]), t1=t1, **SOLVE).ok)


@pytest.mark.parametrize("path", ["autodiff", pytest.param("analytic", marks=pytest.mark.slow)])
def test_fast_paths_give_the_same_gradients(path):
    """The reduced (u, a) form chosen by "auto" differentiates like plain autodiff and the analytic form."""
    x = inputs("logistic-direction", "softmax")
    (v_fast, _), g_fast = value_and_grad("logistic-direction", "softmax")(x)
    (v_ref, ok), g_ref = value_and_grad("logistic-direction", "softmax", path)(x)
    assert bool(ok)
    np.testing.assert_allclose(v_fast, v_ref, rtol=1e-9)
    for name in g_ref:
        np.testing.assert_allclose(
            ravel_pytree(g_fast[name])[0], ravel_pytree(g_ref[name])[0], rtol=1e-7, atol=1e-10, err_msg=name
        )


def test_vmap_of_grad_equals_grad_of_batched_flow():
    """Per-init gradients by jax.vmap equal the gradient of polarize's own batching (blocks + lax.map).

    The temperature is shared, closed over inside `over_inits`: its gradient is the sum over inits.
    """
    model = pz.init_ensemble(5, 3, tokens=TOKENS, dim=DIM, v_scale=0.5, a_scale=0.3)
    obj = pz.LogisticDirection(objective_arrays("logistic-direction")["b"])
    temperature = jnp.asarray(1.3)

    def entropy_sum(V, a, temperature):
        traj = pz.flow(pz.ValueAttention(V, a, pz.Softmax(temperature=temperature)), obj, t1=HORIZON, **SOLVE)
        return jnp.sum(final_entropy(traj))

    grad = jax.grad(entropy_sum, argnums=(0, 1, 2))
    per_init = jax.jit(jax.vmap(grad, in_axes=(0, 0, None)))(model.V, model.a, temperature)
    whole = jax.jit(grad)(model.V, model.a, temperature)
    np.testing.assert_allclose(whole[0], per_init[0], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(whole[1], per_init[1], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(whole[2], jnp.sum(per_init[2]), rtol=1e-10)
    assert abs(float(whole[2])) > 1e-6


def test_descend_gradient_equals_unrolled_loop():
    """Gradients through `descend` (scanned, vmapped) equal a hand-written Python GD loop."""
    lr, steps = 0.05, 15
    x = inputs("square", "softmax1")
    del x["t1"]

    def through_descend(x):
        model = pz.ValueAttention(x["V"], x["a"], pz.Softmax1(sink=x["norm"]))
        obj = pz.Square(x["objective"]["X"], x["objective"]["y"])
        traj = pz.descend(model, obj, lr, steps=steps, save_at=[0, steps])
        return final_entropy(traj) + final_loss(traj)

    def unrolled(x):
        X, y, sink = x["objective"]["X"], x["objective"]["y"], x["norm"]

        def weights(a):
            e = jnp.exp(a - jnp.max(a))
            return e / (jnp.exp(sink - jnp.max(a)) + jnp.sum(e))

        def loss(V, a):
            return jnp.sum((y - X @ (V @ weights(a))) ** 2)

        V, a = x["V"], x["a"]
        for _ in range(steps):
            gV, ga = jax.grad(loss, argnums=(0, 1))(V, a)
            V, a = V - lr * gV, a - lr * ga
        p = weights(a) / jnp.sum(weights(a))
        return -jnp.sum(p * jnp.log(p)) + loss(V, a)

    g = jax.jit(jax.grad(through_descend))(x)
    ref = jax.jit(jax.grad(unrolled))(x)
    np.testing.assert_allclose(ravel_pytree(g)[0], ravel_pytree(ref)[0], rtol=1e-9, atol=1e-12)
    assert abs(float(g["norm"])) > 1e-6


def test_backsolve_and_forward_mode_agree_with_the_checkpointed_gradient():
    """BacksolveAdjoint (reverse, O(1) memory) and ForwardMode (jax.jvp) against the default."""
    x = inputs("logistic-direction", "softmax")
    (_, _), ref = value_and_grad("logistic-direction", "softmax")(x)
    t1 = x.pop("t1")  # backsolve cannot differentiate t1: keep it fixed

    def with_adjoint(name):
        fn = statistic("logistic-direction", "softmax", adjoint=pz.adjoint(name))
        return lambda x: fn(x | {"t1": t1})[0]

    back = jax.jit(jax.grad(with_adjoint("backsolve")))(x)
    tangent = jax.tree.map(jnp.ones_like, x)
    _, jvp = jax.jit(lambda x: jax.jvp(with_adjoint("forward"), (x,), (tangent,)))(x)
    ref.pop("t1")
    # The backward adjoint ODE is solved to the same tolerances, not exactly.
    np.testing.assert_allclose(ravel_pytree(back)[0], ravel_pytree(ref)[0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(jvp, jnp.sum(ravel_pytree(ref)[0]), rtol=1e-8)


def test_unknown_adjoint_is_refused():
    with pytest.raises(pz.PolarizeError, match="`adjoint` must be one of checkpoint, backsolve, forward"):
        pz.adjoint("adjoint-sensitivity")
    assert isinstance(pz.adjoint("backsolve"), diffrax.BacksolveAdjoint)
