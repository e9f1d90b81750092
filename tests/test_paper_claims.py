"""The paper's claims about the value-softmax model that tests/test_claims.py does not cover.

Sizes and tolerances repeat those of test_claims.py and test_descent.py where possible,
so the compiled solves are shared within a pytest session.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz


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
