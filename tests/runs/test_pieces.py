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
