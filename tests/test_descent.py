"""Discrete descent: GD tracks the flow at O(lr), optimizers run per initialization, divergence is flagged."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import polarize as pz


def test_gd_error_against_flow_is_first_order_in_lr():
    model = pz.init_ensemble(0, 8, tokens=5, dim=4, v_scale=0.5)
    obj = pz.random_direction(1, 4)
    horizon = 20.0
    ref = pz.flow(model, obj, t1=horizon, ts=[0.0, horizon], rtol=1e-12, atol=1e-14)
    lrs = np.array([0.08, 0.04, 0.02, 0.01])
    errors = []
    for lr in lrs:
        traj = pz.descend(
            model, obj, float(lr), steps=int(round(horizon / lr)), save_at=[0, int(round(horizon / lr))]
        )
        assert np.isclose(float(traj.ts[-1]), horizon)
        errors.append(float(jnp.max(jnp.abs(traj.weights[:, -1] - ref.weights[:, -1]))))
    slope = np.polyfit(np.log(lrs), np.log(errors), 1)[0]
    assert 0.9 < slope < 1.1, (slope, errors)


def test_descend_equals_python_loop():
    """The scanned, vmapped loop equals plain per-initialization Python steps."""
    model = pz.init_ensemble(3, 3, tokens=4, dim=3, v_scale=0.5, a_scale=0.3)
    obj = pz.conditioned_regression(0, 3, 3, 2.0)
    opt = optax.adam(0.05)
    traj = pz.descend(model, obj, opt, steps=7, save_at=[0, 3, 7])
    for i in range(3):
        theta = (model.V[i], model.a[i])
        state = opt.init(theta)
        saved = {0: theta}
        for k in range(1, 8):
            m = pz.ValueAttention(*theta, model.norm)
            grads = pz.fields.gradient(m, obj)
            updates, state = opt.update(grads, state, theta)
            theta = optax.apply_updates(theta, updates)
            saved[k] = theta
        for j, k in enumerate([0, 3, 7]):
            np.testing.assert_allclose(traj.V[i, j], saved[k][0], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(traj.a[i, j], saved[k][1], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(traj.steps, [0, 3, 7])
    np.testing.assert_array_equal(traj.ts, [0, 3, 7])  # no lr given: time is the step index


@pytest.mark.parametrize("optimizer", [optax.sgd(0.05, momentum=0.9), optax.adam(0.01)])
def test_momentum_and_adam_polarize_softmax(optimizer):
    model = pz.init_ensemble(0, 16, tokens=6, dim=6)
    traj = pz.descend(model, pz.random_direction(1, 6), optimizer, steps=3000, n_save=8)
    s = pz.summarize(traj, pz.random_direction(1, 6))
    assert s.aggregates["n_failed"] == 0
    assert s.aggregates["median_max_weight"] > 0.8


def test_divergence_is_flagged_per_initialization():
    model = pz.init_ensemble(0, 4, tokens=3, dim=3, v_scale=0.1)
    V = model.V.at[1].multiply(10.0)  # lr 2 is unstable for this init only
    model = pz.ValueAttention(V, model.a)
    obj = pz.Square(None, jnp.ones(3))
    traj = pz.descend(model, obj, 2.0, steps=1000, n_save=4)
    assert list(np.asarray(traj.ok)) == [True, False, True, True]
    assert list(np.asarray(traj.status)) == [pz.status.OK, pz.status.NONFINITE, pz.status.OK, pz.status.OK]
    summary = pz.summarize(traj, obj)
    assert summary.aggregates["n_failed"] == 1


def test_bad_descend_arguments():
    model = pz.init_ensemble(0, 2, tokens=3, dim=2)
    obj = pz.random_direction(0, 2)
    with pytest.raises(pz.PolarizeError, match="`steps` must be a positive integer"):
        pz.descend(model, obj, 0.1, steps=0)
    with pytest.raises(pz.PolarizeError, match="`lr` must be a positive finite number"):
        pz.descend(model, obj, -0.1, steps=3)
    with pytest.raises(pz.PolarizeError, match="`optimizer` must be an optax GradientTransformation"):
        pz.descend(model, obj, "adam", steps=3)
