"""The observation of saved states: a few at a time where the objective's data is large."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core import _trajectory


def test_saved_states_are_observed_a_few_at_a_time_past_the_budget(monkeypatch):
    obj = pz.random_labels(1, 40, 3)  # X: 40 x 3 = 120 numbers of data
    betas = jax.random.normal(jax.random.key(2), (7, 3))
    # the loss written out, one saved state at a time
    X, y = np.asarray(obj.X), np.asarray(obj.y)
    want = [np.mean(np.logaddexp(0.0, -y * (X @ b))) for b in np.asarray(betas)]
    for budget, at_once in ((10_000, 7), (360, 3), (100, 1)):  # all, 3 at a time, one by one
        monkeypatch.setattr(_trajectory, "OBSERVE_BUDGET", budget)
        program = str(jax.make_jaxpr(lambda b: _trajectory.over_saved(obj, b, obj))(betas))
        assert ("scan" in program) == (at_once < 7), program  # under the budget: the plain vmap
        got = _trajectory.over_saved(obj, betas, obj)
        np.testing.assert_allclose(got, want, rtol=1e-14)
        if at_once < 7:
            assert f"length={7 // at_once}" in program  # the scan takes `at_once` states a pass


def test_a_flow_and_descent_past_the_budget_are_the_same_solves(monkeypatch):
    # another program (the saved states observed one by one), so compared to rounding
    model, obj = pz.init_ensemble(0, 6, tokens=4, dim=3), pz.random_labels(1, 40, 3)
    runs = {}
    for budget in (2**16, 100):
        monkeypatch.setattr(_trajectory, "OBSERVE_BUDGET", budget)
        jax.clear_caches()  # the budget is read when the program is traced
        runs[budget] = (
            pz.flow(model, obj, t1=30.0, n_save=5),
            pz.descend(model, obj, 0.2, steps=40, n_save=5),
        )
    for whole, apart in zip(runs[2**16], runs[100], strict=True):
        np.testing.assert_array_equal(apart.V, whole.V)  # the solve itself is untouched
        np.testing.assert_allclose(apart.loss, whole.loss, rtol=1e-14)
        np.testing.assert_allclose(apart.weights, whole.weights, rtol=1e-14)
        assert float(jnp.ptp(whole.loss[:, [0, -1]])) > 1e-3  # the losses move: a real check


def test_at_refuses_an_initialization_the_trajectory_does_not_hold():
    traj = pz.flow(pz.init_ensemble(0, 3, tokens=4, dim=4), pz.random_direction(1, 4), t1=10.0, n_save=3)
    np.testing.assert_array_equal(traj.at(-3).V, traj.V[0])  # as for a list
    np.testing.assert_array_equal(traj.at(2).a, traj.a[2])
    for i in (3, -4):
        with pytest.raises(pz.PolarizeError, match=rf"`i` must be an initialization in -3..2; got {i}"):
            traj.at(i)
    with pytest.raises(Exception, match=r"`i` must be an initialization in -3..2"):  # traced: at run time
        jax.jit(lambda i: traj.at(i).a)(5)
    with pytest.raises(pz.PolarizeError, match="batched trajectory"):
        traj.at(0).at(0)


@pytest.mark.parametrize("b", [[1e-320, 0.0], [1e300, 1e300]], ids=["underflow", "overflow"])
def test_a_direction_whose_norm_is_no_float_is_refused(b):
    # it gave b = [nan, nan] and [0, 0]: a NaN or zero loss everywhere, silently
    with pytest.raises(pz.PolarizeError, match="`b`'s norm under- or overflows; rescale `b`"):
        pz.LogisticDirection(b)
    # traced: at run time (XLA flushes the subnormal 1e-320 to zero: then b is zero)
    with pytest.raises(Exception, match="`b`'s norm under- or overflows|`b` must be non-zero"):
        jax.jit(lambda b: pz.LogisticDirection(b).b)(jnp.asarray(b))
    np.testing.assert_allclose(
        pz.LogisticDirection(np.asarray(b) / np.max(np.abs(b))).b, [1.0, 0.0] if b[1] == 0 else [2**-0.5] * 2
    )
