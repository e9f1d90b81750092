"""The batched stepping loop against diffeqsolve, closed forms, and per-initialization failures."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core import status as codes
from polarize.core._batching import batch_axes
from polarize.core._errors import PolarizeError
from polarize.core.fields import FIELDS
from polarize.solve import _engine as engine
from polarize.solve._engine import integrate
from polarize.solve._options import SolveOptions

TIGHT = dict(rtol=1e-10, atol=1e-12)


def _decay(s, y, args):
    """dy/ds = -k y, k per initialization: y(s) = y0 exp(-k s)."""
    return -args * y


def _solve(field, y0, args, args_axes, ts, *, method, ends_only=False, **kw):
    opts = dict(solver=diffrax.Tsit5(), max_steps=10_000, **TIGHT) | kw
    options = SolveOptions(t1=ts[-1], ends_only=ends_only, **opts)
    return eqx.filter_jit(
        lambda y0, args: integrate(
            field, y0, args, args_axes, t0=ts[0], t1=ts[-1], ts=ts, options=options, method=method
        )
    )(y0, args)


@pytest.mark.parametrize("ends_only", [False, True])
def test_batched_matches_closed_form_and_diffeqsolve(ends_only):
    k = jnp.linspace(0.5, 3.0, 7)
    y0 = jnp.stack([jnp.linspace(1.0, 2.0, 7), -jnp.ones(7)], axis=-1)
    ts = jnp.linspace(0.0, 2.0, 9)
    fast = _solve(lambda s, y, k: -k * y, y0, k, 0, ts, method="batched", ends_only=ends_only)
    ref = _solve(lambda s, y, k: -k * y, y0, k, 0, ts, method="diffeqsolve", ends_only=ends_only)
    at = ts[jnp.array([0, -1])] if ends_only else ts
    exact = y0[:, None, :] * jnp.exp(-k[:, None, None] * at[None, :, None])
    np.testing.assert_allclose(fast.ys, exact, rtol=0, atol=1e-9)
    np.testing.assert_allclose(fast.ys, ref.ys, rtol=0, atol=1e-8)
    assert np.all(fast.status == codes.OK)
    assert np.max(np.abs(np.asarray(fast.steps) - np.asarray(ref.steps))) <= 1


@pytest.mark.parametrize("solver", [diffrax.Dopri5(), diffrax.Bosh3()], ids=lambda s: type(s).__name__)
def test_saved_times_use_each_solvers_own_interpolation(solver):
    # The loop takes the interpolation's weights from the solver's interpolation class
    # (on a one-number state) and sums the stages itself: its saved states must be the
    # solver's own dense output, for each interpolation diffrax has (Dopri5's fourth-order
    # polynomial, Bosh3's Hermite cubic, Dopri8's own), on the same accepted steps.
    k = jnp.linspace(0.5, 3.0, 5)
    y0 = jnp.stack([jnp.linspace(1.0, 2.0, 5), -jnp.ones(5)], axis=-1)
    ts = jnp.linspace(0.0, 2.0, 13)
    kw = dict(solver=solver, rtol=1e-6, atol=1e-8)
    fast = _solve(lambda s, y, k: -k * y, y0, k, 0, ts, method="batched", **kw)
    ref = _solve(lambda s, y, k: -k * y, y0, k, 0, ts, method="diffeqsolve", **kw)
    np.testing.assert_array_equal(fast.steps, ref.steps)
    np.testing.assert_allclose(fast.ys, ref.ys, rtol=0, atol=1e-13)
    # not a bound any interpolation passes: a linear one between the step ends is ~1e-4 off
    exact = y0[:, None, :] * jnp.exp(-k[:, None, None] * ts[None, :, None])
    assert np.max(np.abs(fast.ys - exact)) < 1e-5


def _system_problem(kind, n=6):
    """y0, args, args_axes and field of a polarize gradient flow (log clock)."""
    model = pz.init_ensemble(3, n, tokens=4, dim=3, v_scale=0.5, a_scale=0.5)
    objective, path = {
        "reduced": (pz.random_direction(1, 3), "reduced"),
        "analytic": (pz.conditioned_regression(2, 3, 3, 3.0), "analytic"),
        "span": (pz.conditioned_regression(2, 2, 3, 3.0), "span"),
        "autodiff": (pz.peaked_distribution(4, 3), "autodiff"),
    }[kind]
    system = FIELDS[path]()

    def field(s, y, args):
        m, o, c = args
        return jax.tree.map(lambda d: jnp.exp(s) * d, system.field(y, m, o, c))

    y0, consts = jax.vmap(
        lambda V, a: (
            system.initial(pz.ValueAttention(V, a), objective),
            system.constants(pz.ValueAttention(V, a), objective),
        )
    )(model.V, model.a)
    return field, y0, (model, objective, consts), (batch_axes(model), batch_axes(objective), 0)


def _field_layouts():
    """Every field and both layouts, each layout twice; the other four pairs are slow."""
    fast = {
        ("reduced", "inits last"),
        ("span", "inits last"),
        ("analytic", "inits first"),
        ("autodiff", "inits first"),
    }
    for kind in ("reduced", "analytic", "span", "autodiff"):
        for layout in ("inits last", "inits first"):
            marks = () if (kind, layout) in fast else pytest.mark.slow
            yield pytest.param(kind, layout, marks=marks, id=f"{kind}-{layout}")


@pytest.mark.parametrize("kind, layout", list(_field_layouts()))
def test_batched_matches_diffeqsolve_on_polarize_fields(kind, layout, monkeypatch):
    monkeypatch.setattr(engine, "SOA_MAX_STATE", 10**6 if layout == "inits last" else 0)
    field, y0, args, axes = _system_problem(kind)
    ts = jnp.log1p(jnp.asarray(pz.save_times(1e3, 12)))
    fast = _solve(field, y0, args, axes, ts, method="batched")
    ref = _solve(field, y0, args, axes, ts, method="diffeqsolve")
    for a, b in zip(jax.tree.leaves(fast.ys), jax.tree.leaves(ref.ys)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(fast.status, ref.status)
    # The two take the same steps (same tableau, controller, start): measured equal for
    # every field and layout here, 100-690 steps per init; one step apart is allowed for
    # a rounding at an accept/reject boundary. (At the default tolerances they are equal
    # too; checked once here, at the tolerance with the most steps, one program each.)
    assert np.max(np.abs(np.asarray(fast.steps) - np.asarray(ref.steps))) <= 1


def test_max_steps_and_nonfinite_fields_are_per_initialization():
    k = jnp.array([1.0, 4000.0, 1.0, jnp.nan, 2.0])  # a stiff one and a NaN field
    y0 = jnp.ones((5, 2))
    ts = jnp.linspace(0.0, 1.0, 5)
    out = _solve(_decay, y0, k, 0, ts, method="batched", max_steps=200, rtol=1e-6, atol=1e-8)
    assert list(np.asarray(out.status)) == [
        codes.OK,
        codes.MAX_STEPS,
        codes.OK,
        codes.NONFINITE,
        codes.OK,
    ]
    alone = _solve(_decay, y0[::2], k[::2], 0, ts, method="batched", max_steps=200, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(alone.ys, out.ys[::2])  # the failures did not touch the rest
    ref = _solve(_decay, y0, k, 0, ts, method="diffeqsolve", max_steps=200, rtol=1e-6, atol=1e-8)
    assert int(ref.status[1]) == codes.MAX_STEPS


def test_results_do_not_depend_on_batch_size():
    k = jnp.linspace(0.1, 5.0, 300)
    y0 = jnp.stack([jnp.cos(k), jnp.sin(k)], axis=-1)
    ts = jnp.linspace(0.0, 3.0, 7)
    big = _solve(_decay, y0, k, 0, ts, method="batched", rtol=1e-6, atol=1e-8)
    small = _solve(_decay, y0[:5], k[:5], 0, ts, method="batched", rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(small.ys, big.ys[:5])
    np.testing.assert_array_equal(small.steps, big.steps[:5])


def test_large_states_step_in_sub_blocks_each_to_its_own_end(monkeypatch):
    # states of >= SUB_BLOCK_MIN_STATE numbers (inits first) are stepped SUB_BLOCK inits
    # at a time on a CPU, each sub-block's loop ending with its own slowest init (here
    # the rates rise from one sub-block to the next, and with them the step counts): every
    # init still reaches t1 with the exact solution, in its own row
    n, size = 4 * engine.SUB_BLOCK, engine.SUB_BLOCK_MIN_STATE
    stepped = []  # the sizes the stepping loop is traced for
    step = engine._step_block
    monkeypatch.setattr(engine, "_step_block", lambda *a: stepped.append(a[-1][0].shape[0]) or step(*a))
    k = jnp.geomspace(0.05, 40.0, n)
    y0 = jnp.cos(jnp.arange(n)[:, None] + jnp.linspace(0.0, 3.0, size)[None, :])
    ts = jnp.linspace(0.0, 2.0, 9)
    out = _solve(_decay, y0, k, 0, ts, method="batched", rtol=1e-8, atol=1e-10, block_size=n)
    assert stepped == [engine.SUB_BLOCK if jax.default_backend() == "cpu" else n]
    exact = y0[:, None, :] * jnp.exp(-k[:, None, None] * ts[None, :, None])
    np.testing.assert_allclose(out.ys, exact, rtol=0, atol=1e-7)
    assert np.all(np.asarray(out.status) == codes.OK)


def test_gradients_through_the_batched_loop():
    """Reverse mode (checkpointed loop) and forward mode agree with diffeqsolve and the closed form."""
    k = jnp.array([0.5, 1.5, 2.5])
    ts = jnp.linspace(0.0, 1.0, 4)

    def total(k, method, adjoint=None):
        out = _solve(_decay, jnp.ones((3, 1)), k, 0, ts, method=method, adjoint=adjoint)
        return jnp.sum(out.ys)

    exact = jax.grad(lambda k: jnp.sum(jnp.exp(-k[:, None] * ts[None, :])))(k)
    # jitted whole, as a training loop calls it: one program per method (unjitted, the
    # inner jit's forward and backward compile as two)
    grad = jax.jit(jax.grad(total), static_argnums=1)
    g = grad(k, "batched")
    np.testing.assert_allclose(g, exact, rtol=0, atol=1e-8)
    np.testing.assert_allclose(g, grad(k, "diffeqsolve"), rtol=0, atol=1e-8)
    _, tangent = jax.jvp(lambda k: total(k, "batched", diffrax.ForwardMode()), (k,), (jnp.ones(3),))
    np.testing.assert_allclose(tangent, jnp.sum(exact), rtol=0, atol=1e-8)


def test_bad_method():
    with pytest.raises(PolarizeError, match="method"):
        _solve(_decay, jnp.ones((2, 1)), jnp.ones(2), 0, jnp.linspace(0.0, 1.0, 3), method="rk4")


def test_a_block_program_is_traced_once_and_maps_every_block():
    # block_map traces its block program once (for the output shapes and the loop body
    # both: a solver's took ~0.6 s to trace and was traced twice), and still writes
    # every block, the last one padded
    from polarize.core._batching import block_map

    calls = []

    def per_block(x):
        calls.append(x.shape)
        return {"double": 2 * x, "row_sum": jnp.sum(x, axis=1)}

    x = jnp.arange(10 * 3, dtype=jnp.float64).reshape(10, 3)
    out = jax.jit(lambda x: block_map(per_block, x, block_size=4))(x)
    assert calls == [(4, 3)]
    np.testing.assert_array_equal(out["double"], 2 * np.asarray(x))
    np.testing.assert_array_equal(out["row_sum"], np.asarray(x).sum(axis=1))


@pytest.mark.parametrize("n", [10, 13, 16, 6, 3])
def test_an_init_is_computed_at_the_same_row_of_its_block_whatever_the_batch(n):
    # XLA's vectorized loops can round a row by where it falls in the block, so init i
    # must sit at row i % size in every batch, the last block's too
    from polarize.core._batching import block_map, blockwise

    size = 6
    row = lambda x: {"row": jnp.broadcast_to(jnp.arange(size), x.shape[:1]), "x": x}
    out = jax.jit(lambda x: block_map(row, x, block_size=size))(jnp.arange(float(n)))
    np.testing.assert_array_equal(out["row"], np.arange(n) % size)
    np.testing.assert_array_equal(out["x"], np.arange(n))
    # a matrix-vector product over blocks of 6 (on an AVX-512 CPU its rows 4 and 5
    # rounded otherwise than rows 0-3): any init's numbers are those of a batch
    # starting at its block
    W = jax.random.normal(jax.random.key(0), (5, 5), jnp.float64)
    x = jax.random.normal(jax.random.key(1), (n, 5), jnp.float64)
    product = jax.jit(lambda x: blockwise(lambda v: jnp.tanh(v @ W) @ W, x, block_size=size))
    whole = np.asarray(product(x))
    for start in range(0, n, size):
        np.testing.assert_array_equal(np.asarray(product(x[start:])), whole[start:])


@pytest.mark.parametrize(
    "solver",
    [diffrax.Tsit5(), diffrax.Dopri5(), diffrax.Bosh3(), diffrax.Dopri8()],
    ids=lambda s: type(s).__name__,
)
def test_a_rolled_step_is_diffraxs_step_with_the_field_traced_once(solver):
    # Small states are stepped with the stages in a loop (`rolled`): the stage's sum is
    # chosen by a switch over the tableau's rows and its increment stored by selects. A
    # wrong row, a stage stored in the wrong slot or one read before it is written would
    # move y1 by far more than rounding; the field is in the program once, not per stage.
    A = jnp.array([[0.3, -1.2, 0.5], [0.7, 0.1, -0.4], [-0.2, 0.9, 0.6]])
    traced = []

    def field(t, y, args):
        traced.append(t)
        return {"u": -jnp.tanh(A @ y["u"]) + jnp.sin(3.0 * t) * y["w"], "w": args * y["u"] * y["w"]}

    y0 = {"u": jnp.array([0.4, -1.1, 0.8]), "w": jnp.array([1.3, 0.2, -0.5])}
    t0, t1, args = jnp.asarray(0.2), jnp.asarray(0.45), jnp.asarray(-0.7)
    term = diffrax.ODETerm(field)
    y1_ref, err_ref, dense_ref, state_ref, _ = solver.step(
        term, t0, t1, y0, args, solver.init(term, t0, t1, y0, args), False
    )
    f0 = field(t0, y0, args)
    stages = len(solver.tableau.c)
    for rolled in (True, False):
        traced.clear()
        y1, err, dense, f1 = jax.jit(
            lambda y0, f0, rolled=rolled: engine._rk_step(
                solver.tableau, field, t0, t1, y0, args, f0, rolled=rolled
            )
        )(y0, f0)
        assert len(traced) == (1 if rolled else stages)
        close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
        jax.tree.map(close, y1, y1_ref)
        jax.tree.map(close, err, err_ref)
        jax.tree.map(close, f1, state_ref[1])
        for j, k in enumerate(dense["k"]):
            jax.tree.map(lambda a, b: close(a, b[j]), k, dense_ref["k"])
