"""Inputs of the Python API that gave a library's own error or a silent wrong answer
(an audit of the API): each is one `PolarizeError` naming the argument."""

import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import polarize as pz

M, OBJ = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(1, 2)


@pytest.mark.parametrize(
    "call, says",
    [
        (  # diffrax's own RuntimeError about adaptive step sizes
            lambda: pz.flow(M, OBJ, t1=10.0, solver=diffrax.Euler()),
            "`solver` must be an adaptive diffrax solver, one with an error estimate",
        ),
        (  # became a per-token temperature, silently
            lambda: pz.normalization("softmax", temperature=np.ones(3)),
            "`temperature` must be a positive finite number (a scalar); got array([1., 1., 1.])",
        ),
        (lambda: pz.Softmax("2"), "`temperature` must be a positive finite number (a scalar); got '2'"),
        (
            lambda: pz.descend(M, OBJ, True, steps=5),
            "`optimizer` must be an optax GradientTransformation or a",
        ),
        (  # truncated to steps 0 and 3, silently
            lambda: pz.descend(M, OBJ, 0.1, steps=5, save_at=[0.5, 3.7]),
            "`save_at` must be a list of whole step indices in [0, 5]; got [0.5, 3.7]",
        ),
        (lambda: pz.descend(M, OBJ, 0.1, steps=5, save_at=[0, np.nan]), "`save_at` must be a list of whole"),
        (  # one_hot_fraction 0.0, silently
            lambda: pz.summarize(pz.flow(M, OBJ, t1=10.0), OBJ, threshold=5),
            "`threshold` must be a number in (0, 1]; got 5",
        ),
    ],
)
def test_bad_input_is_one_error_naming_the_argument(call, says):
    with pytest.raises(pz.PolarizeError, match=re.escape(says)):
        call()


def test_learning_rates_as_numpy_or_jax_scalars_are_learning_rates():
    # np.float32(0.1) was refused as "got float32"; whole-number float steps are steps
    for lr in (np.float32(0.1), np.float64(0.1), jnp.asarray(0.1)):  # the rate is the number given
        np.testing.assert_array_equal(
            pz.descend(M, OBJ, lr, steps=5).V, pz.descend(M, OBJ, float(lr), steps=5).V
        )
    np.testing.assert_array_equal(pz.descend(M, OBJ, 0.1, steps=5, save_at=[0.0, 5.0]).steps, [0, 5])
    assert bool(jnp.all(pz.descend(M, OBJ, optax.adam(0.1), steps=5).ok))


def test_a_non_adaptive_solver_is_refused_and_an_adaptive_one_runs():
    assert bool(jnp.all(pz.flow(M, OBJ, t1=10.0, solver=diffrax.Heun()).ok))
    assert jax.tree.leaves(pz.flow(M, OBJ, t1=10.0, solver=diffrax.Tsit5()).ts)
