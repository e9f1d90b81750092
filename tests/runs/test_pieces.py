"""A sweep's numbers do not depend on how many blocks a run of blocks holds.

The first 128 initializations measured as a run of one block and as the first block of
a run of two are the same numbers, bit for bit, for the two cases that once differed: a
square loss's flow and gradient descent's fitted rate. XLA compiled a lone block as
inlined code and a block of a longer run as a loop body, and gave one of its matrix
products to another library; the rate was computed over the whole run at once.
"""

import jax
import numpy as np
import pytest

from polarize.runs import _numerics, _sweep as sweep
from polarize.runs._config import SweepConfig

CASES = {
    "square flow": dict(objective="square", tokens=10, dim=10, t1=100.0),
    "descent, logistic rate": dict(method="gd", steps=200, lr=0.5),
}


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_one_block_and_the_first_of_two_are_the_same_numbers(settings):
    config = SweepConfig(inits=256, **settings).resolved()
    assert config.block_size == 128
    objective = sweep._objective(config)
    alone = _numerics.measure(config, config.build_model(0, 128), objective)
    first = _numerics.measure(config, config.build_model(0, 256), objective)
    names = list(alone)
    assert np.isfinite(np.asarray(alone["final_loss"])).all()
    assert any(np.isfinite(np.asarray(alone[k])).any() for k in names if k.startswith("time_to"))
    for name in names:
        a, b = np.asarray(alone[name]), np.asarray(first[name])[:128]
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_one_block_is_differentiable_in_both_modes():
    """The lone block's loop (whose trip count XLA does not see) differentiates as the
    loop of a known pass: forward and reverse mode against the closed form."""
    from polarize.core._batching import blockwise

    k = jax.numpy.linspace(0.5, 2.0, 5)

    def f(k):  # sum_i exp(-k_i) sin(k_i), per init in one padded block of 8
        return blockwise(lambda x: jax.numpy.exp(-x) * jax.numpy.sin(x), k, block_size=8).sum()

    exact = np.exp(-k) * (np.cos(k) - np.sin(k))
    np.testing.assert_allclose(jax.grad(f)(k), exact, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(k), exact, rtol=1e-12)
    _, tangent = jax.jvp(f, (k,), (jax.numpy.ones(5),))
    np.testing.assert_allclose(tangent, exact.sum(), rtol=1e-12)
    np.testing.assert_array_equal(jax.jit(f)(k), f(k))


def test_sweeps_that_differ_only_in_what_is_data_share_one_program(compiles):
    """The levels are arrays of the program, not part of it: a second sweep that changes
    only them compiles no new flow (its per-init reduction used to be a new function
    object per config, so each such sweep traced and compiled again)."""
    small = dict(tokens=4, dim=4, inits=8, block_size=8, t1=100.0, n_save=8)
    first = SweepConfig(levels=(0.9, 0.99), **small).resolved()
    second = SweepConfig(levels=(0.6, 0.7), **small).resolved()
    measured = []
    for config in (first, second):
        out, compiled = compiles.counting(
            _numerics.measure, config, config.build_model(0, 8), sweep._objective(config)
        )
        measured.append(out)
    assert "jit(_integrate)" not in compiled
    # and the second sweep's times are of its own levels: lower ones, reached earlier
    low, high = np.asarray(measured[1]["time_to_0.6"]), np.asarray(measured[0]["time_to_0.9"])
    assert np.all(low <= high) and np.any(low < high)
