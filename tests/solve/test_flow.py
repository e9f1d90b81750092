"""The flow against scipy, at long horizons, and its per-initialization failure reports."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import polarize as pz


def scipy_reduced(u0, a0, ts):
    """The logistic-direction softmax flow in (u, a), written by hand, in log-time, by scipy."""

    def field(tau, y):
        u, a = y[: u0.size], y[u0.size :]
        s = np.exp(a - a.max())
        s /= s.sum()
        g = 1.0 / (1.0 + np.exp(u @ s))
        return np.exp(tau) * np.concatenate([g * s, g * s * (u - s @ u)])

    taus = np.log1p(ts)
    sol = solve_ivp(
        field, (0.0, taus[-1]), np.concatenate([u0, a0]), method="DOP853", t_eval=taus, rtol=1e-12, atol=1e-14
    )
    assert sol.success
    return sol.y[: u0.size].T, sol.y[u0.size :].T


@pytest.mark.parametrize("path", ["reduced", "autodiff"])
def test_flow_matches_scipy_up_to_1e6(path):
    model = pz.init_ensemble(0, 3, tokens=5, dim=4, v_scale=0.5)
    obj = pz.random_direction(1, 4)
    ts = np.array([0.0, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6])
    traj = pz.flow(model, obj, t1=1e6, ts=ts, rtol=1e-11, atol=1e-13, path=path)
    assert bool(np.all(traj.ok))
    # the state saved at t = 10 (dense output) is the state of a run that stops at t = 10
    stop = pz.flow(model, obj, t1=10.0, n_save=2, rtol=1e-11, atol=1e-13, path=path)
    np.testing.assert_allclose(traj.weights[:, 2], stop.weights[:, -1], rtol=0, atol=1e-9)
    for i in range(3):
        u0 = np.asarray(model.V[i]).T @ np.asarray(obj.b)
        u_ref, a_ref = scipy_reduced(u0, np.asarray(model.a[i]), ts)
        u = np.einsum("tdk,d->tk", np.asarray(traj.V[i]), np.asarray(obj.b))
        np.testing.assert_allclose(u, u_ref, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(traj.a[i], a_ref, rtol=1e-7, atol=1e-9)


def _numpy_norm(name, a):
    """(s, c -> J^T c) written by hand for the normalizations the reference covers."""
    if name == "softmax":
        s = np.exp(a - a.max())
        s /= s.sum()
        return s, lambda c: s * (c - s @ c)
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-a))
        return s, lambda c: s * (1 - s) * c
    h = np.maximum(a, 0.0)  # relu-norm, away from the all-zero corner
    s = h / h.sum()
    return s, lambda c: (a > 0) * (c - s @ c) / h.sum()


def scipy_full(norm, objective, V0, a0, ts):
    """dV/dt = r s^T, da/dt = J^T V^T r with r = -grad L in numpy, on the log clock, by scipy."""
    shape = V0.shape

    def residual(beta):
        if isinstance(objective, pz.LogisticDirection):
            b = np.asarray(objective.b)
            return b / (1.0 + np.exp(b @ beta))
        X, y = np.asarray(objective.X), np.asarray(objective.y)
        return 2.0 * X.T @ (y - X @ beta)

    def field(tau, y):
        V, a = y[: V0.size].reshape(shape), y[V0.size :]
        s, vjp = _numpy_norm(norm, a)
        r = residual(V @ s)
        return np.exp(tau) * np.concatenate([np.outer(r, s).ravel(), vjp(V.T @ r)])

    taus = np.log1p(ts)
    y0 = np.concatenate([V0.ravel(), a0])
    sol = solve_ivp(field, (0.0, taus[-1]), y0, method="DOP853", t_eval=taus, rtol=1e-12, atol=1e-14)
    assert sol.success
    return sol.y[: V0.size].T.reshape((len(ts),) + shape), sol.y[V0.size :].T


REFERENCE_CASES = {
    # name: (norm, objective, path, horizon, a_offset)
    "sigmoid": ("sigmoid", pz.random_direction(1, 4), "analytic", 1e4, 0.0),
    "relu-norm": ("relu-norm", pz.random_direction(1, 4), "analytic", 30.0, 2.0),
    "square-span": ("softmax", pz.conditioned_regression(2, 2, 4, 3.0), "span", 100.0, 0.0),
    "softmax-1e12": ("softmax", pz.random_direction(1, 4), "auto", 1e12, 0.0),
}


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_flow_matches_scipy_full_field(case):
    """Other normalizations, the square loss on the span path, and t = 1e12, against scipy on (V, a)."""
    norm, obj, path, t1, offset = REFERENCE_CASES[case]
    model = pz.init_ensemble(0, 2, tokens=5, dim=4, v_scale=0.5, a_scale=0.3, a_offset=offset, norm=norm)
    ts = np.concatenate([[0.0], np.geomspace(1.0, t1, 5)])
    traj = pz.flow(model, obj, t1=t1, ts=ts, rtol=1e-11, atol=1e-13, path=path)
    assert bool(np.all(traj.ok))
    for i in range(2):
        V_ref, a_ref = scipy_full(norm, obj, np.asarray(model.V[i]), np.asarray(model.a[i]), ts)
        np.testing.assert_allclose(traj.V[i], V_ref, rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(traj.a[i], a_ref, rtol=1e-7, atol=1e-8)


def test_linear_clock_agrees_with_log_clock():
    model = pz.init_ensemble(2, 2, tokens=4, dim=3)
    obj = pz.random_direction(3, 3)
    kw = dict(t1=30.0, n_save=5, rtol=1e-11, atol=1e-13)
    lin, log = pz.flow(model, obj, clock="linear", **kw), pz.flow(model, obj, **kw)
    np.testing.assert_allclose(lin.weights, log.weights, atol=1e-8)


def test_horizon_1e30_takes_few_steps_and_stays_finite():
    model = pz.init_ensemble(0, 4, tokens=8, dim=8)
    traj = pz.flow(model, pz.random_direction(1, 8), t1=1e30, n_save=16)
    assert bool(np.all(traj.ok))
    assert int(np.max(traj.steps)) < 500  # log-time: a few hundred steps, not 1e30 / dt
    s_max = np.max(traj.weights[:, -1], axis=-1)
    assert np.all(s_max > 0.999) and np.all(s_max < 1)
    assert np.all(np.isfinite(traj.V))


def test_stiff_solver_can_be_chosen():
    model = pz.init_ensemble(0, 2, tokens=4, dim=3)
    obj = pz.conditioned_regression(0, 3, 3, 2.0)
    ref = pz.flow(model, obj, t1=20.0, n_save=4, rtol=1e-10, atol=1e-12)
    stiff = pz.flow(model, obj, t1=20.0, n_save=4, solver=diffrax.Kvaerno5(), rtol=1e-8, atol=1e-10)
    assert bool(np.all(stiff.ok))
    np.testing.assert_allclose(stiff.weights, ref.weights, atol=1e-6)


def test_failure_is_per_initialization():
    """One initialization that cannot finish within max_steps fails alone; the rest are untouched."""
    model = pz.init_ensemble(0, 4, tokens=4, dim=3, v_scale=0.1)
    V = model.V.at[2].multiply(300.0)  # a fast, stiff outlier under the square loss
    model = pz.ValueAttention(V, model.a, "softmax")
    obj = pz.conditioned_regression(0, 3, 3, 1.0)
    traj = pz.flow(model, obj, t1=10.0, n_save=4, max_steps=200)
    assert list(np.asarray(traj.ok)) == [True, True, False, True]
    assert int(traj.status[2]) == pz.status.MAX_STEPS and int(traj.status[0]) == pz.status.OK
    alone = pz.flow(pz.ValueAttention(model.V[:2], model.a[:2]), obj, t1=10.0, n_save=4, max_steps=200)
    np.testing.assert_array_equal(alone.weights, traj.weights[:2])
    s = pz.summarize(traj, obj)
    assert s.aggregates["n_failed"] == 1 and s.aggregates["n_inits"] == 4


def test_single_initialization_has_no_batch_axis():
    m = pz.init_ensemble(0, 1, tokens=4, dim=3)
    single = pz.ValueAttention(m.V[0], m.a[0])
    traj = pz.flow(single, pz.random_direction(0, 3), t1=10.0, n_save=5)
    assert traj.weights.shape == (5, 4) and traj.V.shape == (5, 3, 4) and traj.ok.shape == ()
    # the same solve as the batch of one (another program: compared to rounding)
    batch = pz.flow(m, pz.random_direction(0, 3), t1=10.0, n_save=5)
    np.testing.assert_allclose(traj.weights, batch.weights[0], rtol=1e-12)
    # to rounding of the array's scale: an entry that cancels to -0.034 among entries of
    # 0.18 differed by 5e-14 under another codegen (LLVM -O0)
    np.testing.assert_allclose(traj.V, batch.V[0], rtol=0, atol=1e-12 * np.abs(batch.V[0]).max())


def test_batch_composition_does_not_change_results():
    """Initialization i is the same, bit for bit, in batches of 10 and 1000."""
    obj = pz.random_direction(7, 8)
    big = pz.flow(pz.init_ensemble(5, 1000, tokens=8, dim=8), obj, t1=1e4, n_save=8)
    small = pz.flow(pz.init_ensemble(5, 10, tokens=8, dim=8), obj, t1=1e4, n_save=8)
    np.testing.assert_array_equal(small.V, big.V[:10])
    np.testing.assert_array_equal(small.a, big.a[:10])
    offset = pz.init_ensemble(5, 10, tokens=8, dim=8, start=990)
    np.testing.assert_array_equal(offset.V, pz.init_ensemble(5, 1000, tokens=8, dim=8).V[990:])
    # in the batch of 1000 the last 104 are a padded block (of 128): still the same numbers
    tail = pz.flow(offset, obj, t1=1e4, n_save=8)
    np.testing.assert_array_equal(tail.V, big.V[990:])
    np.testing.assert_array_equal(tail.weights, big.weights[990:])
    np.testing.assert_array_equal(tail.status, big.status[990:])


def test_initialization_i_is_drawn_from_seed_and_i_alone():
    """init_ensemble's batched draw against the definition, drawn here op by op per init."""
    batch = pz.init_ensemble(5, 300, tokens=4, dim=3, v_scale=0.3, a_scale=0.7, a_offset=-0.2, start=40)
    for i in (40, 41, 200, 339):
        kv, ka = jax.random.split(jax.random.fold_in(jax.random.key(5), i))
        np.testing.assert_array_equal(batch.V[i - 40], 0.3 * jax.random.normal(kv, (3, 4)))
        np.testing.assert_array_equal(batch.a[i - 40], -0.2 + 0.7 * jax.random.normal(ka, (4,)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(t1=-1.0), r"`t1` must be greater than `t0`, got t0=0.0, t1=-1.0|`t1` must be greater"),
        (dict(t1=1.0, t0=2.0), "`t1` must be greater than `t0`"),
        (dict(t1=float("nan")), "`t1` must be finite"),
        (dict(t1=1.0, n_save=0), "`n_save` must be a positive integer"),
        (dict(t1=1.0, ts=[0.5, 0.1]), "`ts` must be non-decreasing"),
        (dict(t1=1.0, clock="loglog"), "`clock` must be one of log, linear"),
    ],
)
def test_bad_flow_arguments(kwargs, message):
    m = pz.init_ensemble(0, 2, tokens=3, dim=2)
    with pytest.raises(pz.PolarizeError, match=message):
        pz.flow(m, pz.random_direction(0, 2), **kwargs)


def test_bad_model_inputs():
    with pytest.raises(pz.PolarizeError, match="`a` must have shape"):
        pz.ValueAttention(jnp.ones((3, 4)), jnp.ones(5))
    with pytest.raises(pz.PolarizeError, match="`V` contains NaN"):
        pz.ValueAttention(jnp.full((3, 4), jnp.nan), jnp.ones(4))
    with pytest.raises(pz.PolarizeError, match="different numbers of initializations"):
        pz.flow(pz.init_ensemble(0, 3, tokens=3, dim=2), pz.LogisticDirection(jnp.ones((2, 2))), t1=1.0)
    with pytest.raises(pz.PolarizeError, match="`tokens` must be a positive integer"):
        pz.init_ensemble(0, 3, tokens=0, dim=2)
    with pytest.raises(pz.PolarizeError, match="`b` must be non-zero"):
        pz.LogisticDirection(jnp.zeros(3))
    with pytest.raises(pz.PolarizeError, match=r"`X` of shape \(samples, dim\) needs `y`"):
        pz.Square(jnp.ones((4, 3)), jnp.ones(5))
    with pytest.raises(pz.PolarizeError, match="`p` must be a probability vector"):
        pz.CrossEntropy(jnp.array([0.5, 0.7]))
    with pytest.raises(pz.PolarizeError, match="labels -1 or \\+1"):
        pz.LogisticData(jnp.ones((2, 3)), jnp.array([0.0, 1.0]))
    with pytest.raises(pz.PolarizeError, match="`kappa` must be >= 1"):
        pz.conditioned_regression(0, 3, 3, 0.5)


def test_kappa_is_the_condition_number():
    X = np.asarray(pz.conditioned_regression(0, 20, 20, 5.0).X)
    sv = np.linalg.svd(X, compute_uv=False)
    np.testing.assert_allclose(sv, np.linspace(1, 0.2, 20), rtol=1e-10)
    assert jax.numpy.isclose(sv[0] / sv[-1], 5.0)


@pytest.mark.parametrize("objective", ["direction", "data"])
def test_value_path_factors_rebuild_the_values(objective):
    """A reduced or span trajectory keeps V as offset + basis @ coords; every accessor
    (dense, one time, b^T V, V s) agrees with plain numpy on the rebuilt matrices, and the
    rebuilt V is the analytic path's V."""
    model = pz.init_ensemble(3, 4, tokens=5, dim=6, v_scale=0.5)
    obj = pz.random_direction(1, 6) if objective == "direction" else pz.random_labels(2, 3, 6)
    traj = pz.flow(model, obj, t1=50.0, n_save=7, rtol=1e-10, atol=1e-12)
    path = traj.value_path
    assert path.basis is not None and path.basis.shape[-1] == (1 if objective == "direction" else 3)
    V = np.asarray(traj.V)
    assert V.shape == path.shape == (4, 7, 6, 5)
    ref = pz.flow(model, obj, t1=50.0, n_save=7, rtol=1e-10, atol=1e-12, path="analytic")
    np.testing.assert_allclose(V, np.asarray(ref.V), rtol=0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(path.at(3)), V[:, 3], rtol=1e-13, atol=1e-13)
    b = np.random.default_rng(0).normal(size=(4, 6))
    np.testing.assert_allclose(np.asarray(path.project(b)), np.einsum("itdk,id->itk", V, b), atol=1e-12)
    s = np.asarray(traj.weights)
    np.testing.assert_allclose(np.asarray(path.apply(s)), np.einsum("itdk,itk->itd", V, s), atol=1e-12)
    # the loss the trajectory reports is the objective at the rebuilt V
    beta = np.einsum("itdk,itk->itd", V, s)
    for i in range(4):
        for j in (0, 6):
            np.testing.assert_allclose(float(traj.loss[i, j]), float(obj(beta[i, j])), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("start", [-1, 2**32 - 2, 1.5])
def test_initialization_indices_out_of_range_are_refused(start):
    """Indices are 32-bit: a start below 0 or past 2^32 - n would wrap onto other inits."""
    with pytest.raises(pz.PolarizeError, match=r"^`start` must be an integer in \[0, 2\^32 - n\] \(n = 3\)"):
        pz.init_ensemble(0, 3, tokens=2, dim=2, start=start)
    with pytest.raises(pz.PolarizeError, match="`start` must be an integer"):
        pz.init_keys(0, 3, start=start)


def test_solve_options_resolve_every_default_once():
    """`SolveOptions.resolved` decides solver, clock, adjoint, times and ends_only for the problem."""
    from polarize.core.fields import prepare
    from polarize.solve import _stiff

    def resolved(model, objective, **kw):
        model, objective, field = prepare(model, objective)
        return pz.SolveOptions(**kw).resolved(model, objective, field)

    toy = pz.init_ensemble(0, 4, tokens=3, dim=3), pz.random_direction(1, 3)
    o = resolved(*toy, t1=1e5)
    assert isinstance(o.solver, diffrax.Tsit5) and o.clock == "log" and o.block_size == 128
    assert isinstance(o.adjoint, diffrax.RecursiveCheckpointAdjoint) and not o.ends_only
    np.testing.assert_array_equal(o.ts, pz.save_times(1e5, 64))
    assert resolved(*toy, t1=1e5, n_save=2).ends_only and not resolved(*toy, t1=1e5, ts=[0, 1e5]).ends_only
    square = pz.init_ensemble(0, 4, tokens=3, dim=3), pz.conditioned_regression(2, 3, 3, 3.0)
    stiff = resolved(*square, t1=1e6)
    assert isinstance(stiff.solver, _stiff.Rosenbrock) and stiff.clock == "linear"
    short = resolved(*square, t1=1.0)
    assert isinstance(short.solver, diffrax.Tsit5) and short.clock == "linear"
    given = pz.SolveOptions(t1=1e6, solver=diffrax.Dopri5())
    assert isinstance(given.restart_solver(), diffrax.Dopri5)
    assert isinstance(pz.SolveOptions(t1=1e6).restart_solver(), diffrax.Tsit5)  # not the stiff default
    with pytest.raises(pz.PolarizeError, match="`clock` must be one of"):
        pz.SolveOptions(t1=1.0, clock="tau")
    with pytest.raises(pz.PolarizeError, match="`block_size`"):
        pz.SolveOptions(t1=1.0, block_size=0)


def test_a_sweep_config_turns_into_the_flows_options():
    """`SweepConfig.solve_options` carries the config's settings and targets to the solver unchanged."""
    config = pz.SweepConfig(t1=3e4, rtol=1e-7, atol=1e-9, max_steps=5000, n_save=16, solver="dopri5")
    o = config.solve_options()
    assert (o.t1, o.rtol, o.atol, o.max_steps, o.n_save, o.block_size) == (3e4, 1e-7, 1e-9, 5000, 16, 128)
    assert isinstance(o.solver, diffrax.Dopri5)
    np.testing.assert_array_equal(o.targets.values, [0.5, 0.9, 0.99, 1e-3])
    np.testing.assert_array_equal(o.targets.kinds, [0, 0, 0, 1])


def test_n_save_below_two_is_refused():
    # it returned ts = [t1] alone, t0 dropped, where a sweep refuses it
    m, obj = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(0, 2)
    with pytest.raises(
        pz.PolarizeError, match=r"`n_save` must be >= 2 \(the first and last saved times\); got 1"
    ):
        pz.flow(m, obj, t1=10.0, n_save=1)
    np.testing.assert_allclose(pz.flow(m, obj, t1=10.0, n_save=2).ts, [0.0, 10.0], rtol=1e-15)
