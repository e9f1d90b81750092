"""The stiff default: Rosenbrock order, its structured Jacobian solve, long horizons against scipy.

References are independent of the code under test: closed-form solutions for the
order check, `jax.jacfwd` of the field for the structured solve, and for long
horizons the gradient flow written by hand in numpy and integrated by scipy's
LSODA (which switches to BDF once stiff) at rtol 1e-10.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy.integrate import solve_ivp

import polarize as pz
from polarize.core import status
from polarize.core.fields import choose_field
from polarize.solve import _stiff as stiff

SIZE = 4
HORIZONS = {"cross-entropy": 1e7, "square": 1e6}


# --- the method --------------------------------------------------------------------------


def fixed_step_error(field, y0, exact, n_steps):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        stiff.Rosenbrock(),
        t0=0.0,
        t1=1.0,
        dt0=1.0 / n_steps,
        y0=y0,
        stepsize_controller=diffrax.ConstantStepSize(),
    )
    return float(jnp.max(jnp.abs(sol.ys[-1] - exact)))


@pytest.mark.parametrize(
    "field, y0, exact",
    [
        # autonomous, nonlinear: y = 1 / (1 + t)
        (lambda t, y, args: -(y**2), jnp.array([1.0]), 0.5),
        # non-autonomous (exercises the df/dt term): y = exp(1 - e^t)
        (lambda t, y, args: -jnp.exp(t) * y, jnp.array([1.0]), np.exp(1 - np.e)),
    ],
    ids=["autonomous", "time-dependent"],
)
def test_rosenbrock_is_third_order(field, y0, exact):
    errors = [fixed_step_error(field, y0, exact, n) for n in (8, 16, 32)]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all((orders > 2.7) & (orders < 3.5)), orders


def test_rosenbrock_is_l_stable():
    """One step of size 1e8 on y' = -y lands on ~0 (an explicit method would blow up)."""
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: -y),
        stiff.Rosenbrock(),
        t0=0.0,
        t1=1e8,
        dt0=1e8,
        y0=jnp.array([1.0]),
        stepsize_controller=diffrax.ConstantStepSize(),
    )
    assert abs(float(sol.ys[-1, 0])) < 1e-6


# --- the structured solve ----------------------------------------------------------------


def model_and_objective(objective: str, norm: str, samples: int = SIZE, n: int = 2, seed: int = 0):
    model = pz.init_ensemble(seed, n, tokens=SIZE, dim=SIZE, norm=norm, v_scale=0.5, a_scale=0.5)
    if objective == "cross-entropy":
        return model, pz.peaked_distribution(seed + 1, SIZE, 3.0)
    return model, pz.conditioned_regression(seed + 1, samples, SIZE, 5.0)


@pytest.mark.parametrize(
    "objective, norm, samples, path",
    [
        ("cross-entropy", "softmax", SIZE, "analytic"),
        ("cross-entropy", "sigmoid", SIZE, "autodiff"),
        ("square", "softmax", SIZE - 1, "span"),
        ("square", "softmax1", SIZE, "analytic"),
    ],
)
def test_structured_solve_is_the_dense_solve(objective, norm, samples, path):
    """(I - c J)^(-1) b by blocks equals the dense solve with J = jax.jacfwd of the field."""
    models, obj = model_and_objective(objective, norm, samples)
    model = pz.ValueAttention(models.V[0], models.a[0], models.norm)
    system = choose_field(model, obj, path)
    constants = system.constants(model, obj)
    args = (model, obj, constants)
    y = jax.tree.map(lambda x: x + 0.3, system.initial(model, obj))  # away from any special point
    field = lambda y: system.field(y, model, obj, constants)
    flat, unravel = ravel_pytree(y)
    # each piece jitted whole (op by op, they compiled ~120 small programs per case)
    J = jax.jit(jax.jacfwd(lambda z: ravel_pytree(field(unravel(z)))[0]))(flat)
    b = unravel(jax.random.normal(jax.random.key(1), flat.shape, flat.dtype))
    _, jvp = jax.linearize(field, y)
    vjp = lambda w: jax.linear_transpose(jvp, y)(w)[0]
    solve = jax.jit(lambda b, c: stiff.KroneckerSchur(stiff._flow_weights).factor(jvp, vjp, y, args, c)(b))
    assert isinstance(stiff.stiff_solver(model, system).stage_solve, stiff.KroneckerSchur)
    m = y[0].size  # ravel_pytree order: the M block (rows x tokens), then the tokens block a
    eps = np.finfo(flat.dtype).eps
    for c in (0.3, 1e5):  # a small step, and a step far past every decay time
        A = np.eye(flat.size) - c * np.asarray(J)
        expected = np.linalg.solve(A, np.asarray(ravel_pytree(b)[0]))
        got = solve(b, c)
        # The tolerance is the two solves' rounding, derived from the system, not one CPU's. The dense
        # LU (partial pivoting) is backward stable: error <~ cond(A) eps |x|. The structured solve is
        # block elimination without pivoting between the blocks: x_a comes from the tokens block's
        # Schur complement S = A_aa - A_aM A_MM^(-1) A_Ma, formed and factored with rounding ~eps |S|,
        # so error <~ cond(S) eps |x_a|. At c = 1e5, |S| / |A| ~ 1e4 (cond(S) up to 3e8 against
        # cond(A) <= 1e5): a bound on cond(A) alone does not hold for it (measured up to 5e2 x).
        # Factor 8: measured error / (dense + blocks) is 0.03-0.74 over every case and c (2-norms);
        # the bound stays <= 3e-7 relative, so a wrong block (an O(1) error) or even 1e-6 fails it.
        S = A[m:, m:] - A[m:, :m] @ np.linalg.solve(A[:m, :m], A[:m, m:])
        dense = np.linalg.cond(A) * eps * np.linalg.norm(expected)
        blocks = np.linalg.cond(S) * eps * np.linalg.norm(expected[m:])
        error = np.linalg.norm(ravel_pytree(got)[0] - expected)
        assert error <= 8 * (dense + blocks), f"c={c:g}: error {error:.3g}, bound 8 x {dense + blocks:.3g}"


# --- long horizons against scipy ---------------------------------------------------------


def scipy_flow(V0, a0, norm: str, objective, ts):
    """dV/dt = r s^T, da/dt = J_sigma^T V^T r by hand in numpy; LSODA at rtol 1e-10."""
    d, T = V0.shape

    def weights(a):
        if norm == "softmax":
            e = np.exp(a - a.max())
            return e / e.sum()
        return 1 / (1 + np.exp(-a))

    def jt(s, w):
        return s * (w - s @ w) if norm == "softmax" else s * (1 - s) * w

    def residual(beta):
        if isinstance(objective, pz.CrossEntropy):
            q = np.exp(beta - beta.max())
            return np.asarray(objective.p) - q / q.sum()
        X, y = np.asarray(objective.X), np.asarray(objective.y)
        return 2 * X.T @ (y - X @ beta)

    def field(t, z):
        V, a = z[: d * T].reshape(d, T), z[d * T :]
        s = weights(a)
        r = residual(V @ s)
        return np.concatenate([np.outer(r, s).ravel(), jt(s, V.T @ r)])

    z0 = np.concatenate([np.asarray(V0).ravel(), np.asarray(a0)])
    sol = solve_ivp(field, (0.0, ts[-1]), z0, method="LSODA", t_eval=ts, rtol=1e-10, atol=1e-12)
    assert sol.success, sol.message
    return sol.y[: d * T].T.reshape(-1, d, T), sol.y[d * T :].T


@pytest.mark.parametrize(
    "objective, norm",
    [
        ("cross-entropy", "softmax"),
        ("square", "softmax"),
        ("square", "sigmoid"),
        pytest.param("cross-entropy", "sigmoid", marks=pytest.mark.slow),
    ],
)
def test_long_horizon_matches_scipy_with_default_options(objective, norm):
    """Default `flow` (no solver, clock or tolerance given) to the paper's horizons: every
    saved state within 1e-5 of scipy, in a few hundred steps (explicit: ~t1 / 2 steps)."""
    model, obj = model_and_objective(objective, norm)
    t1 = HORIZONS[objective]
    ts = pz.save_times(t1, 8)
    traj = pz.flow(model, obj, t1=t1, ts=ts, block_size=2)
    assert np.all(np.asarray(traj.ok))
    assert np.all(np.asarray(traj.steps) < 1000)
    for i in range(2):
        V, a = scipy_flow(model.V[i], model.a[i], norm, obj, ts)
        np.testing.assert_allclose(traj.V[i], V, rtol=0, atol=1e-5)
        np.testing.assert_allclose(traj.a[i], a, rtol=0, atol=1e-5)


def test_default_method_and_override():
    model, ce = model_and_objective("cross-entropy", "softmax")
    solver, clock = stiff.default_method(model, ce, pz.fields.Analytic())
    assert isinstance(solver, stiff.Rosenbrock) and clock == "linear"
    # the stiff method once curvature x horizon is long, an explicit one before
    long = stiff.STIFF_HORIZON / float(ce.curvature())
    solver, clock = stiff.default_method(model, ce, pz.fields.Analytic(), 2 * long)
    assert isinstance(solver, stiff.Rosenbrock) and clock == "linear"
    solver, clock = stiff.default_method(model, ce, pz.fields.Analytic(), 0.5 * long)
    assert isinstance(solver, diffrax.Tsit5) and clock == "linear"
    solver, clock = stiff.default_method(model, pz.random_direction(0, SIZE), pz.fields.Reduced())
    assert isinstance(solver, diffrax.Tsit5) and clock == "log"
    # `solver=` overrides: explicit Tsit5 cannot reach 1e5 in 2,000 steps, and says so per init.
    traj = pz.flow(model, ce, t1=1e5, n_save=2, solver=diffrax.Tsit5(), max_steps=2000, block_size=2)
    assert not np.any(np.asarray(traj.ok))
    assert np.all(np.asarray(traj.status) == status.MAX_STEPS)


def test_the_default_is_decided_on_the_concrete_objective_not_on_a_traced_one():
    """`decided` writes the default's choice into the options from the concrete objective's
    curvature; traced (a program taking the objective as an argument) the curvature is
    unknown and the default takes the stiff method at any horizon."""
    from polarize.solve._flow import decided
    from polarize.solve._options import SolveOptions

    model, ce = model_and_objective("cross-entropy", "softmax")
    long = stiff.STIFF_HORIZON / float(ce.curvature())
    short = decided(model, ce, SolveOptions(t1=0.5 * long))
    assert isinstance(short.solver, diffrax.Tsit5) and short.clock == "linear"
    assert isinstance(decided(model, ce, SolveOptions(t1=2 * long)).solver, stiff.Rosenbrock)
    toy = decided(model, pz.random_direction(0, SIZE), SolveOptions(t1=1e5))
    assert isinstance(toy.solver, diffrax.Tsit5) and toy.clock == "log"
    # the same question asked of a traced objective: the stiff method
    picked = []
    jax.make_jaxpr(lambda o: picked.append(decided(model, o, SolveOptions(t1=0.5 * long)).solver) or 0.0)(ce)
    assert isinstance(picked[0], stiff.Rosenbrock)
    # given, the solver and clock are kept
    given = decided(model, ce, SolveOptions(t1=2 * long, solver=diffrax.Dopri5(), clock="log"))
    assert isinstance(given.solver, diffrax.Dopri5) and given.clock == "log"


def test_unfinished_init_is_reported_not_averaged():
    """With max_steps just below the slowest init's steps, that init fails with MAX_STEPS and
    is left out of the summary; the inits that finish are bit-identical to the unconstrained run.
    (max_steps counts rejected steps too, so only the slowest init's fate is known in advance.)"""
    model, obj = model_and_objective("square", "softmax")
    ts = pz.save_times(1e6, 8)
    full = pz.flow(model, obj, t1=1e6, ts=ts, block_size=2)  # the program of the scipy test
    steps = np.asarray(full.steps)
    capped = pz.flow(model, obj, t1=1e6, ts=ts, block_size=2, max_steps=int(steps.max()) - 1)
    ok = np.asarray(capped.ok)
    assert not ok[np.argmax(steps)] and ok.any(), steps
    np.testing.assert_array_equal(np.asarray(capped.status)[~ok], status.MAX_STEPS)
    np.testing.assert_array_equal(np.asarray(capped.status)[ok], status.OK)
    np.testing.assert_array_equal(np.asarray(capped.V)[ok], np.asarray(full.V)[ok])
    summary = pz.summarize(capped, obj)
    assert summary.aggregates["n_failed"] == int((~ok).sum())
    expected = np.median(np.asarray(full.weights)[ok, -1].max(-1))
    np.testing.assert_allclose(summary.aggregates["median_max_weight"], expected, rtol=1e-12)


# The gradient through the stiff default against finite differences, to t = 1e4 (long
# after the loss converged), is tests/measure/test_gradients.py::
# test_stiff_flow_gradient_matches_fd_until_long_after_convergence (one compiled program
# with its t = 20 check).


def test_stiff_default_keeps_float32():
    model, obj = model_and_objective("cross-entropy", "softmax")
    traj = pz.flow(model, obj, t1=1e5, n_save=2, precision="float32", block_size=2)
    assert traj.V.dtype == jnp.float32 and np.all(np.asarray(traj.ok))
    ref = pz.flow(model, obj, t1=1e5, n_save=2, block_size=2)  # float64
    np.testing.assert_allclose(traj.weights, ref.weights, rtol=0, atol=1e-3)
