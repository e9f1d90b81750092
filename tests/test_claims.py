"""The paper's claims about the value-softmax model, checked on small ensembles.

Sizes and tolerances repeat each other's and those of tests/solve/test_descent.py where possible,
so the compiled solves are shared within a pytest session.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import polarize as pz


def test_logistic_softmax_polarizes_with_order_preserved():
    obj = pz.random_direction(1, 6)
    model = pz.init_ensemble(0, 64, tokens=6, dim=6)  # a(0) = 0
    traj = pz.flow(model, obj, t1=1e8, n_save=24)
    s = pz.summarize(traj, obj)
    assert s.aggregates["n_failed"] == 0
    assert s.aggregates["order_preserved_fraction"] == 1.0
    assert s.aggregates["winner_is_argmax_u0_fraction"] == 1.0
    mw, top = s.series["max_weight"], s.series["top_share"]
    # growth toward one: monotone medians, and close to one at the horizon
    assert np.all(np.diff(np.median(mw, 0)) >= -1e-12)
    assert np.median(mw[:, -1]) > 0.98 and np.median(top[:, -1]) > 0.995
    # ... at the paper's logarithmic rate: 1 - max s ~ C / (log t)^2 with C of order one
    t = np.asarray(traj.ts)[-6:]
    c = (1 - np.median(mw[:, -6:], 0)) * np.log1p(t) ** 2
    assert np.all((1 < c) & (c < 5)) and c.max() / c.min() < 1.5, c
    # loss decreases to zero only slowly (margin ~ log t)
    assert np.all(np.diff(s.series["loss"], axis=1) <= 1e-15)


def _crosses(x):
    """Whether any two columns of x (times, tokens) swap order at some time: a loop over pairs."""
    T = x.shape[-1]
    return any(np.any((x[:, j] - x[:, k]) * (x[-1, j] - x[-1, k]) < 0) for j in range(T) for k in range(j))


def test_order_statistic_detects_a_crossing():
    """The order flag is not vacuous: it equals a loop over pairs, and crossings are reported."""
    obj = pz.random_direction(1, 4)
    fractions = []
    for a_scale in (2.0, 0.0):  # a(0) against u(0)'s order, then a(0) = 0 (the paper's setting)
        model = pz.init_ensemble(0, 16, tokens=4, dim=4, a_scale=a_scale)
        traj = pz.flow(model, obj, t1=1e6, n_save=32)
        s = pz.summarize(traj, obj)
        u = np.einsum("itdk,d->itk", np.asarray(traj.V), np.asarray(obj.b))
        a = np.asarray(traj.a)
        loop = [not (_crosses(u[i]) or _crosses(a[i])) for i in range(16)]
        np.testing.assert_array_equal(s.final["order_preserved"], loop)
        fractions.append(s.aggregates["order_preserved_fraction"])
    assert fractions[0] < 1.0 == fractions[1]


def test_sigmoid_does_not_polarize():
    obj = pz.random_direction(1, 6)
    model = pz.init_ensemble(0, 32, tokens=6, dim=6, norm="sigmoid")
    s = pz.summarize(pz.flow(model, obj, t1=1e8, n_save=8), obj)
    assert s.aggregates["n_failed"] == 0
    assert np.max(s.final["max_weight"]) < 0.3  # uniform is 1/6 ~ 0.17
    assert s.aggregates["one_hot_fraction"] == 0.0


def test_square_loss_goes_to_zero_and_polarizes_only_partially():
    obj = pz.conditioned_regression(0, 6, 6, 2.0)
    model = pz.init_ensemble(0, 16, tokens=6, dim=6, v_scale=0.1, a_scale=0.1)
    s = pz.summarize(pz.flow(model, obj, t1=1e3, n_save=8), obj)
    assert s.aggregates["n_failed"] == 0
    assert np.max(s.final["loss"]) < 1e-8 < np.min(s.series["loss"][:, 0])
    start = np.median(s.series["max_weight"][:, 0])
    assert start + 0.1 < s.aggregates["median_max_weight"] < 0.9  # it moves, but stops short of one-hot


def test_tied_model_flow_and_summary():
    D = 6
    a0 = 1 + 0.1 * np.random.default_rng(0).standard_normal((4, D))
    model = pz.TiedValueAttention(jnp.broadcast_to(jnp.eye(D), (4, D, D)), a0)
    obj = pz.random_direction(3, D)
    traj = pz.flow(model, obj, t1=1e4, n_save=8)
    assert bool(np.all(traj.ok)) and traj.V.shape == (4, 8, D, D)
    s = pz.summarize(traj, obj)
    assert s.aggregates["median_max_weight"] > 0.5
    # against scipy on the tied field written by hand: z = U a, s = softmax(z), beta = U s, r = g b,
    # dU/dt = r s^T + (J U^T r) a^T, da/dt = U^T J U^T r with J = diag(s) - s s^T
    ts = np.asarray(traj.ts)
    exact = pz.flow(model, obj, t1=1e4, ts=ts, rtol=1e-11, atol=1e-13)
    b = np.asarray(obj.b)

    def field(tau, y):
        U, a = y[: D * D].reshape(D, D), y[D * D :]
        z = U @ a
        s = np.exp(z - z.max())
        s /= s.sum()
        r = b / (1.0 + np.exp(b @ (U @ s)))
        w = s * (U.T @ r - s @ (U.T @ r))  # J U^T r
        return np.exp(tau) * np.concatenate([(np.outer(r, s) + np.outer(w, a)).ravel(), U.T @ w])

    for i in range(4):
        y0 = np.concatenate([np.eye(D).ravel(), a0[i]])
        taus = np.log1p(ts)
        sol = solve_ivp(field, (0, taus[-1]), y0, "DOP853", t_eval=taus, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(exact.a[i], sol.y[D * D :].T, rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(exact.V[i], sol.y[: D * D].T.reshape(-1, D, D), rtol=1e-7, atol=1e-8)


def test_normalizations_split_into_one_hot_and_not():
    """Logistic loss (paper 4): softmax, relu-, l1-, square-norm go one-hot; sum-norm and sigmoid do not."""
    T = 6
    obj = pz.random_direction(1, T)
    final = {}
    for norm in ("softmax", "relu-norm", "l1-norm", "square-norm", "sum-norm", "sigmoid"):
        model = pz.init_ensemble(0, 16, tokens=T, dim=T, a_offset=1.0, a_scale=0.1, norm=norm)
        s = pz.summarize(pz.descend(model, obj, 0.5, steps=10_000, n_save=2), obj)
        assert s.aggregates["n_failed"] == 0, norm
        final[norm] = s.final["max_weight"]
    for norm in ("softmax", "relu-norm", "l1-norm", "square-norm"):
        # most initializations one-hot already after 1e4 steps (relu-/l1-norm are the slowest)
        assert np.median(final[norm]) > 0.9 and np.mean(final[norm] > 0.9) >= 0.5, (norm, final[norm])
    for norm in ("sum-norm", "sigmoid"):
        assert np.max(final[norm]) < 0.6 and np.median(final[norm]) < 0.4, (norm, final[norm])


def test_asymptotic_rate_is_inverse_log_squared():
    """1 - max s ~ C / (log t)^2: slope of log(1 - s_max) on log log t over [1e20, 1e40] is -2 +- 0.3."""
    obj = pz.random_direction(1, 6)
    model = pz.init_ensemble(0, 64, tokens=6, dim=6)
    ts = np.minimum(pz.save_times(1e40, 24), 1e40)
    w = np.asarray(pz.flow(model, obj, t1=1e40, ts=ts).weights)
    gap = np.sum(w, -1) - np.max(w, -1)  # 1 - s_max without cancellation
    late = ts >= 1e20
    x = np.log(np.log(ts[late]))
    slopes = np.polyfit(x, np.log(gap[:, late]).T, 1)[0]
    assert np.all(np.abs(slopes + 2) < 0.3), slopes
    C = gap[:, -1] * np.log(ts[-1]) ** 2
    assert 0.1 < np.median(C) < 10  # C of order one
    # and the rate is not already reached early: the exponent is steeper before t = 1e6
    early = (ts >= 1e2) & (ts <= 1e6)
    early_slopes = np.polyfit(np.log(np.log(ts[early])), np.log(gap[:, early]).T, 1)[0]
    assert np.median(early_slopes) < np.median(slopes)


def test_polarization_grows_with_conditioning():
    """Square loss (paper 3, n = d = T = 20): ill-conditioned X keeps the residual alive, polarizes more.

    Default tolerances: the medians (0.053, 0.521, 0.893) agree with rtol 1e-8 to 1e-6,
    in a quarter of the stiff solver's steps.
    """
    model = pz.init_ensemble(0, 8, tokens=20, dim=20, v_scale=1e-5, a_scale=1e-3)
    medians = []
    for kappa in (1.0, 3.0, 5.0):
        obj = pz.conditioned_regression(1, 20, 20, kappa)
        s = pz.summarize(pz.flow(model, obj, t1=300.0, n_save=8), obj)
        assert s.aggregates["n_failed"] == 0
        medians.append(s.aggregates["median_max_weight"])
    assert medians[0] < medians[1] < medians[2], medians
    assert medians[0] < 0.1 and medians[2] > 0.5, medians  # uniform is 0.05


def test_modified_flow_tracks_gd_to_second_order():
    """Backward error analysis: GD is O(lr) from the flow but O(lr^2) from the modified flow."""
    model = pz.init_ensemble(0, 8, tokens=5, dim=4, v_scale=0.5)
    obj = pz.random_direction(1, 4)
    horizon = 20.0
    ref = pz.flow(model, obj, t1=horizon, ts=[0.0, horizon], rtol=1e-12, atol=1e-14)
    lrs = np.array([0.08, 0.04, 0.02, 0.01])
    plain, modified = [], []
    for lr in lrs:
        steps = int(round(horizon / lr))
        gd = pz.descend(model, obj, float(lr), steps=steps, save_at=[0, steps])
        mod = pz.modified_flow(model, obj, float(lr), t1=horizon, ts=[0.0, horizon], rtol=1e-12, atol=1e-14)
        assert bool(np.all(mod.ok))
        plain.append(float(jnp.max(jnp.abs(gd.weights[:, -1] - ref.weights[:, -1]))))
        modified.append(float(jnp.max(jnp.abs(gd.weights[:, -1] - mod.weights[:, -1]))))
    assert all(m < 0.1 * p for m, p in zip(modified, plain, strict=True)), (modified, plain)
    slope = np.polyfit(np.log(lrs), np.log(modified), 1)[0]
    assert 1.8 < slope < 2.2, (slope, modified)


def test_modified_flow_at_zero_lr_is_the_flow_and_its_loss_matches_a_closed_form():
    model = pz.init_ensemble(0, 8, tokens=5, dim=4, v_scale=0.5)
    obj = pz.random_direction(1, 4)
    ref = pz.flow(model, obj, t1=20.0, ts=[0.0, 20.0], rtol=1e-12, atol=1e-14)
    zero = pz.modified_flow(model, obj, 0.0, t1=20.0, ts=[0.0, 20.0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(zero.weights, ref.weights, atol=1e-10)
    # L + lr/4 |grad L|^2 against the closed-form gradient dL/dV = -g b s^T, dL/da = -g J^T V^T b
    from polarize.core.fields import modified_loss

    one = pz.ValueAttention(model.V[0], model.a[0])
    s = jax.nn.softmax(one.a)
    margin = jnp.dot(obj.b, one.V @ s)
    g = jax.nn.sigmoid(-margin)
    f = one.V.T @ obj.b
    grad_a = g * s * (f - jnp.dot(s, f))
    expected = jax.nn.softplus(-margin) + 0.25 * 0.3 * (g**2 * jnp.sum(s**2) + jnp.sum(grad_a**2))
    np.testing.assert_allclose(modified_loss(one, obj, 0.3), expected, rtol=1e-12)


def test_bad_modified_flow_arguments():
    model = pz.init_ensemble(0, 2, tokens=3, dim=2)
    obj = pz.random_direction(0, 2)
    with pytest.raises(pz.PolarizeError, match="`lr` must be a finite number >= 0"):
        pz.modified_flow(model, obj, -0.1, t1=1.0)
    with pytest.raises(pz.PolarizeError, match="`t1` must be greater than `t0`"):
        pz.modified_flow(model, obj, 0.1, t1=0.0)
    with pytest.raises(pz.PolarizeError, match="`ts` must be non-decreasing and lie in"):
        pz.modified_flow(model, obj, 0.1, t1=1.0, ts=[0.5, 0.2])


def _tied(D, n, norm):
    a0 = 1 + 0.1 * np.random.default_rng(0).standard_normal((n, D))
    return pz.TiedValueAttention(jnp.broadcast_to(jnp.eye(D), (n, D, D)), a0, norm)


def test_tied_model_winning_column_is_a_massive_activation():
    """beta = U sigma(U a), U(0) = I: the winning column grows far above the median; not for sigmoid."""
    D = 6
    obj = pz.random_direction(3, D)
    ratios = {}
    for norm in ("softmax", "sigmoid"):
        traj = pz.flow(_tied(D, 4, norm), obj, t1=1e4, n_save=8)
        assert bool(np.all(traj.ok))
        cols = np.linalg.norm(np.asarray(traj.V[:, -1]), axis=-2)  # (inits, D)
        win = np.argmax(np.asarray(traj.weights[:, -1]), axis=-1)
        ratios[norm] = cols[np.arange(4), win] / np.median(cols, axis=-1)
    assert np.all(ratios["softmax"] > 3.0), ratios
    assert np.all(ratios["softmax"] > 2 * ratios["sigmoid"]), ratios
