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
        (  # JAX's "Value 'a' with dtype <U1 is not a valid JAX array type"
            lambda: pz.init_ensemble("a", 3, tokens=3, dim=2),
            "`key` must be an int seed, a JAX key (jax.random.key(seed)) or the uint32 data of one; "
            "got a str",
        ),
        (  # JAX's "invalid PRNG key data: expected key_data.ndim >= 1"
            lambda: pz.init_keys(1.5, 3),
            "`key` must be an int seed, a JAX key (jax.random.key(seed)) or the uint32 data of one; "
            "got a float",
        ),
        (lambda: pz.random_direction(None, 3), "`key` must be an int seed, a JAX key"),
        (lambda: pz.init_ensemble(np.zeros(2), 3, tokens=3, dim=2), "got an array of float64 and shape (2,)"),
        (  # a rate fitted to the wrong saved times, silently
            lambda: pz.logistic_rate(np.geomspace(1, 1e4, 20), np.linspace(0.5, 0.99, 25)),
            "`max_weight` must hold one value per saved time on its last axis, `ts` the saved times "
            "(times,); got ts (20,) and max_weight (25,)",
        ),
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
    hits = lambda lr: pz.descend_with_hitting_times(M, OBJ, lr, steps=300)[1]["time_to_0.5"]
    times = hits(np.float32(0.3))  # step x rate in float64, not float32
    assert times.dtype == np.float64 and np.isfinite(times).all()
    np.testing.assert_array_equal(times, hits(float(np.float32(0.3))))
    assert bool(jnp.all(pz.descend(M, OBJ, optax.adam(0.1), steps=5).ok))


def test_a_non_adaptive_solver_is_refused_and_an_adaptive_one_runs():
    assert bool(jnp.all(pz.flow(M, OBJ, t1=10.0, solver=diffrax.Heun()).ok))
    assert jax.tree.leaves(pz.flow(M, OBJ, t1=10.0, solver=diffrax.Tsit5()).ts)


def test_a_traced_learning_rate_is_data_checked_at_run_time():
    # under jit the rate is the same number (bit for bit), under grad the derivative of
    # the final loss in the rate is the central difference's, and a negative rate stops
    # the run with the concrete call's message
    run = lambda lr: pz.descend(M, OBJ, lr, steps=40, n_save=3)
    for a, b in zip(jax.tree.leaves(jax.jit(run)(0.1)), jax.tree.leaves(run(0.1))):
        np.testing.assert_array_equal(a, b)
    final = lambda lr: run(lr).loss[..., -1].sum()
    h = 1e-5
    np.testing.assert_allclose(jax.grad(final)(0.1), (final(0.1 + h) - final(0.1 - h)) / (2 * h), rtol=1e-7)
    with pytest.raises(Exception, match="`lr` must be a positive finite number"):
        jax.block_until_ready(jax.jit(run)(-0.1))
    with pytest.raises(pz.PolarizeError, match="pass the rate once"):
        jax.jit(lambda lr: pz.descend(M, OBJ, lr, lr=0.1, steps=5))(0.1)
    traced = jax.jit(lambda lr: pz.descend_with_hitting_times(M, OBJ, lr, steps=40)[1])(0.1)
    concrete = pz.descend_with_hitting_times(M, OBJ, 0.1, steps=40)[1]
    for name in concrete:
        np.testing.assert_array_equal(traced[name], concrete[name], err_msg=name)


def test_every_form_of_a_seed_draws_the_seeds_numbers():
    # numpy and 0-d JAX integers were refused with JAX's key-data message; a key, its
    # uint32 data and a seed traced by jit are the same seed
    ref = pz.init_ensemble(7, 3, tokens=3, dim=2)
    for key in (np.int64(7), np.array(7), jnp.asarray(7), jax.random.key(7), jax.random.PRNGKey(7)):
        np.testing.assert_array_equal(pz.init_ensemble(key, 3, tokens=3, dim=2).a, ref.a, err_msg=repr(key))
        np.testing.assert_array_equal(pz.random_direction(key, 4).b, pz.random_direction(7, 4).b)
    traced = jax.jit(lambda seed: pz.init_ensemble(seed, 3, tokens=3, dim=2).V)(7)
    keyed = jax.jit(lambda key: pz.init_ensemble(key, 3, tokens=3, dim=2).V)(jax.random.key(7))
    np.testing.assert_array_equal(traced, keyed)
    np.testing.assert_allclose(traced, ref.V, rtol=1e-15, atol=0)
