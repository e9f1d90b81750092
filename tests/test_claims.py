"""The paper's claims about the value-softmax model, checked on small ensembles."""

import jax.numpy as jnp
import numpy as np
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
