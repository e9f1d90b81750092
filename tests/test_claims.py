"""The paper's claims about the value-softmax model, checked on small ensembles."""

import jax.numpy as jnp
import numpy as np

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
    assert np.median(mw[:, 0]) < 0.2 and np.median(top[:, 0]) < 0.6
    # loss decreases to zero only slowly (margin ~ log t)
    assert np.all(np.diff(s.series["loss"], axis=1) <= 1e-15)


def test_order_statistic_detects_a_crossing():
    """The order flag is not vacuous: a trajectory whose logits cross is reported."""
    obj = pz.random_direction(1, 4)
    model = pz.init_ensemble(0, 16, tokens=4, dim=4, a_scale=2.0)  # a(0) against u(0)'s order
    s = pz.summarize(pz.flow(model, obj, t1=1e6, n_save=32), obj)
    assert 0.0 <= s.aggregates["order_preserved_fraction"] < 1.0


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
    assert s.aggregates["median_max_weight"] < 0.9


def test_tied_model_flow_and_summary():
    D = 6
    a0 = 1 + 0.1 * np.random.default_rng(0).standard_normal((4, D))
    model = pz.TiedValueAttention(jnp.broadcast_to(jnp.eye(D), (4, D, D)), a0)
    obj = pz.random_direction(3, D)
    traj = pz.flow(model, obj, t1=1e4, n_save=8)
    assert bool(np.all(traj.ok)) and traj.V.shape == (4, 8, D, D)
    ref = pz.flow(model, obj, t1=1e4, n_save=8, path="autodiff")
    np.testing.assert_array_equal(traj.weights, ref.weights)  # auto = autodiff for tied
    s = pz.summarize(traj, obj)
    assert s.aggregates["median_max_weight"] > 0.5
