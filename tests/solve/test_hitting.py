"""Hitting times and the logistic rate against independent references.

Flow: scipy's `solve_ivp` with event location on the replicator ODE written out in
numpy. Descent: a Python loop of plain gradient descent. Rate: a closed form.
"""

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import polarize as pz
from polarize.core._choices import check_levels
from polarize.measure import logistic_rate

T = D = 3
LEVELS = (0.5, 0.9, 0.99)


def _softmax(a):
    s = np.exp(a - a.max())
    return s / s.sum()


def _scipy_hitting(V0, a0, b, t1):
    """First crossing times by scipy event location (DOP853, rtol 1e-12), numpy field.

    Integrated in tau = log(1 + t) (dy/dtau = (1 + t) dy/dt), so long horizons stay cheap.
    """

    def field(tau, y):
        V, a = y[: D * T].reshape(D, T), y[D * T :]
        s = _softmax(a)
        r = b / (1 + np.exp(b @ V @ s))  # -dL/dbeta for L = log(1 + exp(-<b, beta>))
        J = np.diag(s) - np.outer(s, s)
        return np.exp(tau) * np.concatenate([np.outer(r, s).ravel(), J @ (V.T @ r)])

    def loss(y):
        V, a = y[: D * T].reshape(D, T), y[D * T :]
        return np.logaddexp(0.0, -(b @ V @ _softmax(a)))

    y0 = np.concatenate([V0.ravel(), a0])
    events = [lambda t, y, lv=lv: _softmax(y[D * T :]).max() - lv for lv in LEVELS]
    events.append(lambda t, y, L0=loss(y0): loss(y) - 1e-3 * L0)
    sol = solve_ivp(field, (0.0, np.log1p(t1)), y0, method="DOP853", rtol=1e-12, atol=1e-14, events=events)
    return [np.expm1(e[0]) if len(e) else np.inf for e in sol.t_events]


TOL = {"rtol": 1e-11, "atol": 1e-13}


@pytest.fixture(scope="module")
def solved():
    """Four initializations flowed to t = 3e5 at tight tolerance (one compile for the module)."""
    model = pz.init_ensemble(3, 4, tokens=T, dim=D, v_scale=0.5)
    objective = pz.random_direction(1, D)
    return model, objective, pz.flow(model, objective, t1=3e5, n_save=40, **TOL)


def test_flow_hitting_times_match_scipy_event_location(solved):
    model, objective, traj = solved
    times = pz.hitting_times(traj, model, objective, levels=LEVELS, **TOL)
    assert list(times) == ["time_to_0.5", "time_to_0.9", "time_to_0.99", "time_to_loss_0.001"]
    got = np.stack([np.asarray(v) for v in times.values()], axis=1)
    b = np.asarray(objective.b)
    ref = np.array([_scipy_hitting(np.asarray(model.V[i]), np.asarray(model.a[i]), b, 3e5) for i in range(4)])
    assert np.isfinite(ref).sum() >= 12 and np.isinf(ref).any()  # both cases are exercised
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6)
    # saved times alone would be far off: the root finding is what makes it exact
    ts = np.asarray(traj.ts)
    assert np.min(np.abs(got[finite][:, None] - ts[None]) / got[finite][:, None]) > 1e-4


def test_start_and_failed_inits(solved):
    model, objective, traj = solved
    # a level at or below the start max weight is reached at t0
    low = pz.hitting_times(traj, model, objective, levels=(1 / T, 0.5, 0.9), **TOL)
    np.testing.assert_array_equal(low[f"time_to_{1 / T:g}"], 0.0)
    # a failed initialization gets NaN, the others keep their numbers
    failed = pz.Trajectory(
        ts=traj.ts,
        V=traj.value_path,
        a=traj.a,
        weights=traj.weights,
        loss=traj.loss,
        ok=jnp.array([True, False, True, True]),
        status=traj.status,
    )
    got = pz.hitting_times(failed, model, objective, levels=(1 / T, 0.5, 0.9), **TOL)
    for k, v in got.items():
        v = np.asarray(v)
        assert np.isnan(v[1]) and not np.isnan(v[[0, 2, 3]]).any(), k
        np.testing.assert_array_equal(v[[0, 2, 3]], np.asarray(low[k])[[0, 2, 3]])


@pytest.fixture(scope="module")
def in_loop(solved):
    """`flow_with_hitting_times` on the four inits and a fifth whose V is NaN."""
    model, objective, _ = solved
    broken = eqx.tree_at(
        lambda m: m.V, model, jnp.concatenate([model.V, jnp.full_like(model.V[:1], jnp.nan)])
    )
    broken = eqx.tree_at(lambda m: m.a, broken, jnp.concatenate([model.a, model.a[:1]]))
    levels = (1 / T, *LEVELS)  # 1/T: reached at the start
    return pz.flow_with_hitting_times(broken, objective, t1=3e5, n_save=40, levels=levels, **TOL)


def test_hitting_times_from_the_flows_own_steps_match_scipy_and_the_restarts(solved, in_loop):
    """`flow_with_hitting_times` checks every accepted step and locates the crossing on
    its dense output; scipy's event location and the restart method are independent."""
    model, objective, traj = solved
    got_traj, got = in_loop
    np.testing.assert_array_equal(got_traj.V[:4], traj.V)  # the same solve as `flow`
    assert list(np.asarray(got_traj.ok)) == [True] * 4 + [False]
    assert list(got) == [f"time_to_{1 / T:g}", *[f"time_to_{x:g}" for x in LEVELS], "time_to_loss_0.001"]
    got = np.stack([np.asarray(v) for v in got.values()], axis=1)
    assert np.isnan(got[4]).all()  # the failed init, and only it
    np.testing.assert_array_equal(got[:4, 0], 0.0)
    got = got[:4, 1:]
    b = np.asarray(objective.b)
    ref = np.array([_scipy_hitting(np.asarray(model.V[i]), np.asarray(model.a[i]), b, 3e5) for i in range(4)])
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6)
    restart = pz.hitting_times(traj, model, objective, levels=LEVELS, **TOL)
    restart = np.stack([np.asarray(v) for v in restart.values()], axis=1)
    np.testing.assert_allclose(got[finite], restart[finite], rtol=1e-8)


def test_hitting_times_without_the_batched_loop_fall_back_to_restarts(solved, in_loop):
    """The backsolve adjoint runs diffeqsolve: the times come from restarts, and agree."""
    model, objective, _ = solved
    options = dict(t1=3e5, n_save=40, levels=LEVELS, adjoint=diffrax.BacksolveAdjoint(), **TOL)
    _, restarted = pz.flow_with_hitting_times(model, objective, **options)
    assert list(restarted) == list(in_loop[1])[1:]
    for k in restarted:
        np.testing.assert_allclose(restarted[k], in_loop[1][k][:4], rtol=1e-8, err_msg=k)
    with pytest.raises(pz.PolarizeError, match="unknown option"):
        pz.flow_with_hitting_times(model, objective, t1=1.0, nsave=3)


def test_descent_hitting_times_match_a_python_loop():
    lr, steps = 0.5, 300
    model = pz.init_ensemble(2, 3, tokens=T, dim=D, v_scale=0.5)
    objective = pz.random_direction(1, D)
    got = pz.descent_hitting_times(model, objective, lr, steps=steps, levels=(0.5, 0.9), loss_fraction=0.05)
    b = np.asarray(objective.b)
    for i in range(3):
        V, a = np.asarray(model.V[i]).copy(), np.asarray(model.a[i]).copy()
        first = {}
        L0 = None
        for k in range(steps + 1):
            s = _softmax(a)
            loss = np.logaddexp(0.0, -(b @ V @ s))
            L0 = loss if L0 is None else L0
            for name, reached in (
                ("0.5", s.max() >= 0.5),
                ("0.9", s.max() >= 0.9),
                ("loss_0.05", loss <= 0.05 * L0),
            ):
                if reached and name not in first:
                    first[name] = k * lr
            r = b / (1 + np.exp(b @ V @ s))
            J = np.diag(s) - np.outer(s, s)
            V, a = V + lr * np.outer(r, s), a + lr * J @ (V.T @ r)
        for name in ("0.5", "0.9", "loss_0.05"):
            assert got[f"time_to_{name}"][i] == first.get(name, np.inf), (i, name)
    assert np.isfinite(got["time_to_0.5"]).all()


def test_logistic_rate_recovers_C_from_the_closed_form():
    ts = pz.save_times(1e8, 64)
    C = np.array([0.5, 2.0])
    with np.errstate(divide="ignore"):
        mw = 1 - C[:, None] / np.log(np.maximum(ts, 2.0))[None] ** 2
    rate = logistic_rate(ts, mw)
    np.testing.assert_allclose(rate["rate_C"], C, rtol=1e-12)
    np.testing.assert_allclose(rate["rate_drift"], 0.0, atol=1e-12)
    short = logistic_rate(ts[:3], mw[:, :3])  # no decade to fit: NaN, not a number
    assert np.isnan(short["rate_C"]).all()


@pytest.mark.parametrize("levels", [(0.0,), (1.5,), (0.5, -1.0), ()])
def test_levels_outside_unit_interval_are_refused(levels):
    with pytest.raises(pz.PolarizeError, match=r"`levels` must be numbers in \(0, 1\]"):
        check_levels(levels)


def test_reduced_field_observes_weights_and_loss_without_rebuilding_v():
    """The check at every step: (weights, loss) from (u, a) equal those of the rebuilt V."""
    from polarize.core.fields import AbstractField, Reduced

    model = pz.init_ensemble(5, 1, tokens=T, dim=D, v_scale=0.5)
    model = eqx.tree_at(lambda m: (m.V, m.a), model, (model.V[0], model.a[0]))
    objective = pz.random_direction(2, D)
    u = model.V.T @ objective.direction() + jnp.array([0.3, -1.2, 2.0])  # a state after some flow
    a = model.a + jnp.array([0.5, 0.1, -0.7])
    field = Reduced()
    weights, loss = field.observe((u, a), model, objective)
    ref_weights, ref_loss = AbstractField.observe(field, (u, a), model, objective)  # via V(t)
    b = np.asarray(objective.direction())
    V = model.V + np.outer(b, u - model.V.T @ b) / (b @ b)
    s = _softmax(np.asarray(a))
    np.testing.assert_allclose(weights, s, rtol=1e-14)
    np.testing.assert_allclose(loss, np.logaddexp(0.0, -(b @ V @ s)), rtol=1e-12)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-14)


def test_the_one_root_finder_in_both_forms_finds_a_closed_form_root():
    # chandrupatla (the batched loop's) and Chandrupatla (the restarts' diffrax Event) are
    # one iteration: both stop within 2 (1e-13 (1 + |t|)) of arccos(0.3) and agree exactly
    import optimistix as optx

    from polarize.solve._roots import Chandrupatla, chandrupatla

    gap = lambda t: 0.3 - jnp.cos(t)  # rises through 0 at arccos(0.3)
    lo, hi = jnp.float64(0.2), jnp.float64(1.9)
    root = float(np.arccos(0.3))
    direct = chandrupatla(gap, lo, hi, gap(lo), gap(hi))
    found = optx.root_find(lambda t, _: gap(t), Chandrupatla(), hi, options=dict(lower=lo, upper=hi))
    assert abs(float(direct) - root) < 4e-13 and float(found.value) == float(direct)
    assert float(gap(direct)) >= 0  # the bracket's end past the crossing
    # no bracket (diffrax's lanes without an event: the distance to `upper`): the root is upper
    none = optx.root_find(lambda t, _: hi - t, Chandrupatla(), hi, options=dict(lower=lo, upper=hi))
    assert float(none.value) == float(hi)
    # a gap already >= 0 at lo: the batched loop's rule returns lo
    assert float(chandrupatla(gap, jnp.float64(1.4), hi, gap(1.4), gap(hi))) == 1.4
