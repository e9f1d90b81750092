"""Fast paths against the generic autodiff path: same ODE, same iteration, to 1e-8.

The "span" form (V = V0 + X^T W for dataset objectives), reduced-coordinate
gradient descent, the float32 mode and the block-size option.
"""

import diffrax
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import polarize as pz
from polarize.core.fields import Analytic, Autodiff, Reduced, Span, choose_field
from polarize.measure._statistics import final_statistics

DIM, TOKENS, SAMPLES = 6, 5, 3  # samples < dim: where "span" is the cheaper form


def data_objective(kind, samples=SAMPLES, dim=DIM):
    if kind == "square":
        return pz.conditioned_regression(7, samples, dim, 3.0)
    return pz.random_labels(8, samples, dim)


def ensemble(norm="softmax", n=3):
    return pz.init_ensemble(1, n, tokens=TOKENS, dim=DIM, v_scale=0.5, a_scale=0.5, norm=norm)


@pytest.mark.parametrize("norm", list(pz.NORMALIZATIONS))
@pytest.mark.parametrize("kind", ["square", "logistic-data"])
def test_span_field_equals_autodiff(norm, kind):
    """X^T dW/dt = dV/dt and the da/dt of the (W, a) system equal the full field's."""
    m = ensemble(norm, n=1)
    obj = data_objective(kind)
    V0, a = m.V[0], m.a[0] + 0.3
    W = 0.4 * jax.random.normal(jax.random.key(5), (SAMPLES, TOKENS))
    model0 = pz.ValueAttention(V0, a, m.norm)
    V = V0 + obj.X.T @ W
    dV, da = Autodiff().field((V, a), pz.ValueAttention(V, a, m.norm), obj)
    dW, da_span = Span().field((W, a), model0, obj)
    np.testing.assert_allclose(obj.X.T @ dW, dV, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(da_span, da, rtol=1e-10, atol=1e-13)


def test_auto_picks_span_only_where_cheaper():
    m = ensemble()
    assert choose_field(m, data_objective("square")) == Span()
    assert choose_field(m, data_objective("logistic-data")) == Span()
    assert choose_field(m, data_objective("square", samples=DIM)) == Analytic()
    assert choose_field(m, pz.random_direction(0, DIM)) == Reduced()
    assert choose_field(m, pz.random_direction(0, DIM), euclidean=True) == Analytic()
    with pytest.raises(pz.PolarizeError, match="path='span'.*Square or LogisticData"):
        choose_field(m, pz.random_direction(0, DIM), "span")


@pytest.mark.parametrize("kind, norm", [("square", "softmax"), ("logistic-data", "relu-norm")])
def test_span_flow_agrees_with_autodiff(norm, kind):
    """The span and autodiff fields give the same path, both solved by one explicit high-order solver.

    (The paths are compared, not the solvers: the stiff default is order 3 and slow at
    rtol 1e-12; tests/solve/test_stiff.py checks its span-form Jacobian solve.)
    """
    m, obj = ensemble(norm), data_objective(kind)
    kw = dict(t1=30.0, n_save=6, rtol=1e-12, atol=1e-14, solver=diffrax.Tsit5())
    fast, ref = pz.flow(m, obj, path="span", **kw), pz.flow(m, obj, path="autodiff", **kw)
    assert bool(np.all(fast.ok)) and bool(np.all(ref.ok))
    for name in ("V", "a", "weights", "loss"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=0, atol=1e-8)


@pytest.mark.parametrize(
    "objective", [data_objective("square"), data_objective("logistic-data"), pz.random_direction(2, DIM)]
)
def test_reduced_descent_is_the_same_iteration(objective):
    """Plain GD in reduced coordinates equals GD on (V, a) step for step."""
    m = ensemble()
    fast = pz.descend(m, objective, 0.05, steps=200, n_save=4)
    ref = pz.descend(m, objective, 0.05, steps=200, n_save=4, path="autodiff")
    np.testing.assert_array_equal(fast.steps, ref.steps)
    for name in ("V", "a", "loss"):
        np.testing.assert_allclose(getattr(fast, name), getattr(ref, name), rtol=0, atol=1e-10)


def test_reduced_descent_needs_plain_gd():
    m, obj = ensemble(), pz.random_direction(2, DIM)
    with pytest.raises(pz.PolarizeError, match="path='reduced'.*float learning rate"):
        pz.descend(m, obj, optax.adam(1e-2), steps=3, path="reduced")
    # auto falls back to the exact full gradient for any optax optimizer
    fast = pz.descend(m, obj, optax.adam(1e-2), steps=20, n_save=2)
    ref = pz.descend(m, obj, optax.adam(1e-2), steps=20, n_save=2, path="autodiff")
    np.testing.assert_allclose(fast.V, ref.V, rtol=0, atol=1e-12)


def test_float32_mode_flows_in_float32_close_to_float64(compiles):
    obj = pz.random_direction(1, 8)
    m64 = pz.init_ensemble(0, 4, tokens=8, dim=8)
    m32 = pz.init_ensemble(0, 4, tokens=8, dim=8, dtype=jnp.float32)
    assert m32.V.dtype == jnp.float32
    kw = dict(t1=1e5, n_save=4)
    built32 = pz.flow(m32, obj, **kw)  # a float32 model flows in float32 ...
    # ... and so does precision="float32": the same problem, so the same compiled program
    cast32, compiled = compiles.counting(pz.flow, m64, obj, precision="float32", **kw)
    assert "jit(_integrate)" not in compiled
    refs = (pz.flow(m32, obj, precision="float64", **kw), pz.flow(m64, obj, **kw))
    # one problem asked for by its field's form instead of path="auto": no new program either
    assert isinstance(choose_field(m64, obj), Reduced)
    again, compiled = compiles.counting(pz.flow, m64, obj, path="reduced", **kw)
    assert "jit(_integrate)" not in compiled
    np.testing.assert_array_equal(again.weights, refs[1].weights)
    for tr, ref in zip((built32, cast32), refs, strict=True):
        assert tr.V.dtype == tr.weights.dtype == tr.ts.dtype == jnp.float32
        assert ref.V.dtype == jnp.float64
        assert bool(np.all(tr.ok))
        # at rtol 1e-6 (8 float32 eps) rounding steers float32's step control, so the error
        # moves with the CPU's code: measured 8e-6 to 1.2e-5 (built in float32) and 3e-7
        # (cast) on two codegens; the bound is far below a wrong field's O(0.1)
        np.testing.assert_allclose(tr.weights, ref.weights, rtol=0, atol=2e-4)
    d32 = pz.descend(m64, obj, 0.1, steps=50, n_save=2, precision="float32")
    assert d32.V.dtype == jnp.float32
    with pytest.raises(pz.PolarizeError, match="`precision` must be one of float32, float64"):
        pz.flow(m64, obj, t1=1.0, precision="half")


def test_block_size_is_an_option_and_results_do_not_depend_on_batch_size():
    m, obj = pz.init_ensemble(0, 4, tokens=8, dim=8), pz.random_direction(1, 8)
    whole = pz.flow(m, obj, t1=1e5, n_save=4, block_size=2)
    part = pz.flow(pz.init_ensemble(0, 3, tokens=8, dim=8), obj, t1=1e5, n_save=4, block_size=2)
    np.testing.assert_array_equal(whole.V[:3], part.V)
    other = pz.flow(m, obj, t1=1e5, n_save=4)  # default block size (compiled above)
    np.testing.assert_allclose(whole.weights, other.weights, rtol=0, atol=1e-9)
    with pytest.raises(pz.PolarizeError, match="`block_size` must be a positive integer"):
        pz.flow(m, obj, t1=1.0, block_size=-1)


def _dot_precisions(fn, *args):
    """The `precision` of every matrix product in fn's program (nested jaxprs included)."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(eqn.params["precision"])
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_float32_matrix_products_run_at_full_precision():
    # GPUs multiply float32 matrices in TF32 by default: a field that noisy made the
    # step-size controller crawl (logistic data 38x slower than float64 on an H200,
    # benchmarks/GPU.md). Every product in the flow, descent and statistics programs is
    # pinned to "highest", which a plain jnp product (checked first) is not.
    assert _dot_precisions(lambda x: x @ x, jnp.ones((2, 2), jnp.float32)) == [None]
    obj = pz.random_labels(3, 16, 8)
    model = pz.init_ensemble(0, 4, tokens=8, dim=8, norm="sigmoid", dtype=jnp.float32)
    runs = {
        "flow": lambda m: pz.flow(m, obj, t1=10.0, precision="float32").V,
        "descend": lambda m: pz.descend(m, obj, 0.1, steps=4, n_save=2, precision="float32").V,
        "statistics": lambda m: final_statistics(pz.flow(m, obj, t1=10.0, n_save=4), obj)["final_loss"],
    }
    for name, run in runs.items():
        found = _dot_precisions(run, model)
        assert found, name  # the logistic-data field multiplies matrices
        highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
        assert set(found) == {highest}, (name, set(found))


def test_chunks_in_threads_give_the_unchunked_numbers(monkeypatch):
    # On CPU, flow runs chunks of whole blocks side by side in threads (XLA runs one
    # program's map over blocks on one core). 5 blocks of 4 on 2 threads: chunks of 3
    # blocks, the second padded; every number must be the one-thread run's, bit for bit.
    # (5 x 5: a block's arrays are then not whole multiples of a CPU's vector width, and
    # an init computed at another row of its block, as the one-thread run's last block
    # once did, rounded otherwise on an AVX-512 CPU.)
    model = pz.init_ensemble(0, 18, tokens=5, dim=5, v_scale=0.5)
    obj = pz.random_direction(1, 5)
    run = lambda: pz.flow(model, obj, t1=20.0, n_save=5, block_size=4)
    monkeypatch.setenv("POLARIZE_THREADS", "1")
    whole = run()
    calls = []
    from polarize.core import _batching

    real = _batching.ThreadPoolExecutor

    def counted(workers):
        calls.append(workers)
        return real(workers)

    monkeypatch.setattr(_batching, "ThreadPoolExecutor", counted)
    monkeypatch.setenv("POLARIZE_THREADS", "2")
    chunked = run()
    assert calls == [2]  # two chunks ran side by side
    assert chunked.V.shape == whole.V.shape and chunked.ts.shape == (5,)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # descend too (its saved times and step indices are shared by the chunks)
    descents = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("POLARIZE_THREADS", threads)
        descents[threads] = pz.descend(model, obj, 0.1, steps=30, n_save=3, block_size=4)
    assert descents["2"].steps.shape == (3,) and descents["2"].V.shape[0] == 18
    for a, b in zip(jax.tree.leaves(descents["1"]), jax.tree.leaves(descents["2"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    monkeypatch.setenv("POLARIZE_THREADS", "two")
    with pytest.raises(pz.PolarizeError, match="POLARIZE_THREADS must be a whole number >= 1"):
        run()
