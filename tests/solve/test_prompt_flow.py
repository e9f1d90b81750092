"""Prompt attention under `flow` and `descend`: against scipy, on the log clock to 1e12, and
with X = I against the value-softmax model."""

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import polarize as pz
from polarize.core.fields import Analytic, Prompt


def scipy_prompt(X, y, v, p0, ts, train):
    """The logistic-label softmax flow of (v, p), written by hand in numpy, in log-time, by scipy."""
    n, d = len(X), X.shape[-1]

    def field(tau, z):
        w, p = (v, z) if train == "p" else (z[:d], z[d:])
        scores = X @ p
        s = np.exp(scores - scores.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        values = X @ w
        f = np.sum(values * s, axis=-1)
        e = y / (1.0 + np.exp(y * f)) / n
        c = e[:, None] * values
        dp = np.einsum("ntd,nt->d", X, s * (c - np.sum(s * c, axis=-1, keepdims=True)))
        dv = np.einsum("ntd,nt->d", X, e[:, None] * s)
        return np.exp(tau) * (dp if train == "p" else np.concatenate([dv, dp]))

    z0 = p0 if train == "p" else np.concatenate([v, p0])
    taus = np.log1p(ts)
    sol = solve_ivp(field, (0.0, taus[-1]), z0, method="DOP853", t_eval=taus, rtol=1e-12, atol=1e-14)
    assert sol.success
    return sol.y.T


@pytest.mark.parametrize("train", ["p", "vp"])
def test_flow_matches_scipy(train):
    X, y, v = pz.prompt_task(0, 4, 5, 6)
    model = pz.init_prompts(1, 3, X, v, v_scale=None if train == "p" else 0.5, train=train)
    ts = np.array([0.0, 1.0, 10.0, 1e2, 1e3, 1e4, 1e6])
    traj = pz.flow(model, pz.LogisticLabels(y), t1=1e6, ts=ts, rtol=1e-11, atol=1e-13)
    assert bool(np.all(traj.ok)) and traj.p.shape == traj.v.shape == (3, 7, 6)
    for i in range(3):
        want = scipy_prompt(*map(np.asarray, (X, y, model.v[i], model.p[i])), ts, train)
        got = traj.p[i] if train == "p" else np.concatenate([traj.v[i], traj.p[i]], axis=-1)
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)
    if train == "p":  # v stays where it was
        np.testing.assert_array_equal(traj.v, np.broadcast_to(model.v[:, None], traj.v.shape))


def test_norm_of_p_grows_like_log_t_to_1e12():
    """|p| gains the same amount over each pair of decades (the margin of p/|p| is reached
    only as t -> infinity); a flow with |p| ~ t^c or |p| converging would fail both checks."""
    X, y, v = pz.prompt_task(0, 4, 5, 6)
    model = pz.init_prompts(1, 4, X, v)
    ts = np.array([0.0, 1e8, 1e10, 1e12, 1e14])
    traj = pz.flow(model, pz.LogisticLabels(y), t1=1e14, ts=ts)
    assert bool(np.all(traj.ok)) and bool(np.all(traj.steps < 400))
    norm = np.linalg.norm(np.asarray(traj.p), axis=-1)
    gains = np.diff(norm[:, 1:], axis=-1)  # over 1e8..1e10, 1e10..1e12, 1e12..1e14
    assert np.all(gains > 5.0)
    np.testing.assert_allclose(gains[:, 1], gains[:, 0], rtol=0.02)
    np.testing.assert_allclose(gains[:, 2], gains[:, 1], rtol=0.02)


def identity_pair(norm="softmax", objective="logistic", inits=4):
    """X = I (one sample, tokens = dim) and train="vp": f = v^T sigma(p) is ValueAttention with
    V = v^T (dim 1) and a = p; LogisticLabels([y]) is LogisticDirection([y]) and SquareLabels([y])
    is Square(None, [y])."""
    T = 5
    model = pz.init_prompts(3, inits, jnp.eye(T)[None], jnp.zeros(T), p_scale=0.5, v_scale=0.4, train="vp")
    model = pz.PromptAttention(model.v, model.p + 1.0, model.X, norm=norm, train="vp")
    values = pz.ValueAttention(model.v[:, None, :], model.p, norm=norm)
    y = jnp.array([-1.0])
    if objective == "logistic":
        return model, pz.LogisticLabels(y), values, pz.LogisticDirection(y)
    return model, pz.SquareLabels(y), values, pz.Square(None, y)


@pytest.mark.parametrize("objective", ["logistic", "square"])
@pytest.mark.parametrize("norm", list(pz.NORMALIZATIONS))
def test_identity_tokens_give_the_value_softmax_field(norm, objective):
    """The two models' closed-form fields agree at every state: the same ODE."""
    prompt, p_obj, values, v_obj = identity_pair(norm, objective, inits=1)
    one = pz.PromptAttention(prompt.v[0], prompt.p[0], prompt.X, norm=norm, train="vp")
    dv, dp = Prompt()((one.v, one.p), one, p_obj)
    dV, da = Analytic()((values.V[0], values.a[0]), values, v_obj)
    np.testing.assert_allclose(dv, dV[0], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dp, da, rtol=1e-12, atol=1e-15)


def test_identity_tokens_reproduce_the_value_softmax_flow():
    """... and the flows agree to the solvers' tolerance, to t = 1e8 on the log clock (the
    value-softmax side takes its own `reduced` path)."""
    model, prompt, values, value = identity_pair()
    options = dict(t1=1e8, n_save=9, rtol=1e-11, atol=1e-13, solver=diffrax.Tsit5())
    a, b = pz.flow(model, prompt, **options), pz.flow(values, value, **options)
    assert bool(np.all(a.ok)) and bool(np.all(b.ok))
    np.testing.assert_allclose(a.p, b.a, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a.v, b.V[:, :, 0, :], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(a.weights[:, :, 0, :], b.weights, rtol=1e-8, atol=1e-12)


def test_descent_follows_the_flow_and_keeps_p_and_v():
    X, y, v = pz.prompt_task(0, 4, 5, 6)
    model = pz.init_prompts(1, 2, X, v, v_scale=0.5, train="vp")
    obj = pz.LogisticLabels(y)
    gd = pz.descend(model, obj, 0.01, steps=400, save_at=[0, 400])
    exact = pz.flow(model, obj, t1=4.0, ts=[0.0, 4.0], rtol=1e-11, atol=1e-13)
    assert gd.p.shape == gd.v.shape == (2, 2, 6)
    moved = float(np.max(np.abs(exact.p[:, -1] - exact.p[:, 0])))
    error = float(np.max(np.abs(gd.p[:, -1] - exact.p[:, -1])))
    assert moved > 0.1 and error < 0.02 * moved  # O(lr) from the flow
    final = gd.final(model)  # the model at the last saved step: its p and v, the task's X
    assert isinstance(final, pz.PromptAttention)
    np.testing.assert_array_equal(final.p, gd.p[:, -1])
    np.testing.assert_array_equal(final.v, gd.v[:, -1])
    Xn = np.asarray(X)
    for i in range(2):  # f_j = v^T X_j^T softmax(X_j p), written out
        p_i, v_i = np.asarray(gd.p[i, -1]), np.asarray(gd.v[i, -1])
        s = np.exp(Xn @ p_i)
        s /= s.sum(axis=-1, keepdims=True)
        f = np.array([v_i @ Xn[j].T @ s[j] for j in range(len(Xn))])
        np.testing.assert_allclose(np.asarray(final())[i], f, rtol=1e-12)


def test_square_labels_take_the_stiff_default_at_long_horizons():
    X, y, v = pz.prompt_task(1, 4, 5, 6)
    model = pz.init_prompts(0, 2, X, v, v_scale=0.3, train="vp")
    traj = pz.flow(model, pz.SquareLabels(y), t1=1e6, n_save=3)  # Tsit5 on the log clock: max_steps
    assert bool(np.all(traj.ok)) and bool(np.all(traj.steps < 1000))
    assert float(np.max(traj.loss[:, -1])) < 1e-20


def test_hitting_times_read_the_least_polarized_sample():
    """A level is reached when every sample's max weight is: the crossings located on the
    solver's steps (`flow_with_hitting_times`) and those restarted from saved states
    (`hitting_times`) agree, and each lies where min_i max_t p_it crosses on saved times."""
    X, y, v = pz.prompt_task(0, 4, 5, 6)
    model, objective = pz.init_prompts(1, 3, X, v), pz.LogisticLabels(y)
    options = dict(t1=1e4, levels=(0.5, 0.9), loss_fraction=None, rtol=1e-10, atol=1e-12)
    traj, in_loop = pz.flow_with_hitting_times(model, objective, **options)
    restarted = pz.hitting_times(
        traj, model, objective, **{k: options[k] for k in ("levels", "loss_fraction")}
    )
    top = np.asarray(traj.weights).max(axis=-1).min(axis=-1)  # softmax weights are a distribution
    ts = np.asarray(traj.ts)
    for level in (0.5, 0.9):
        a, b = np.asarray(in_loop[f"time_to_{level:g}"]), np.asarray(restarted[f"time_to_{level:g}"])
        np.testing.assert_allclose(a, b, rtol=1e-5)
        k = np.argmax(top >= level, axis=-1)
        assert np.all(top[np.arange(3), k] >= level) and np.all(k > 0)
        assert np.all((ts[k - 1] <= a) & (a <= ts[k]))
