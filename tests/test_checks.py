"""Failures that used to be silent are loud or correct: each check also holds under jit."""

import re

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core._times import check_times

# Under jit a check cannot raise while tracing; eqx.error_if stops the run with the message.
RUNTIME = (ValueError, RuntimeError)


def _ts(x):
    return check_times(0.0, 1.0, jnp.stack([0.0, x]))[2]


#: (name, builder from one traced scalar, good value, bad value, message): the checks
#: that used to be skipped for tracers, one case each.
TRACED_CHECKS = [
    ("t0 finite", lambda x: check_times(x, 1.0)[0], 0.5, jnp.nan, "`t0` must be finite"),
    ("t1 finite", lambda x: check_times(0.0, x)[1], 1.0, jnp.inf, "`t1` must be finite"),
    ("t0 >= 0", lambda x: check_times(x, 1.0)[0], 0.5, -1.0, "`t0` must be >= 0"),
    ("t1 > t0", lambda x: check_times(0.0, x)[1], 2.0, 0.0, "`t1` must be greater than `t0`"),
    ("ts in range", _ts, 0.5, 2.0, "`ts` must be non-decreasing"),
    ("ts finite", _ts, 0.5, jnp.nan, "`ts` must be a non-empty"),
    ("b non-zero", lambda x: pz.LogisticDirection(x * jnp.ones(3)).b, 1.0, 0.0, "`b` must be non-zero"),
    ("labels", lambda x: pz.LogisticData(jnp.ones((2, 3)), jnp.stack([1.0, x])).y, -1.0, 0.5, "labels -1 or"),
    ("probability", lambda x: pz.CrossEntropy(jnp.stack([0.5, x])).p, 0.5, 0.7, "`p` must be a probability"),
    ("temperature", lambda x: pz.Softmax(temperature=x)(jnp.ones(3)), 1.0, -1.0, "`temperature` must be"),
    ("sink", lambda x: pz.Softmax1(sink=x)(jnp.ones(3)), 1.0, jnp.nan, "`sink` must be a finite number"),
    (
        "finite V",
        lambda x: pz.ValueAttention(x * jnp.ones((2, 3)), jnp.ones(3)).V,
        1.0,
        jnp.inf,
        "`V` contains",
    ),
]


@pytest.mark.parametrize("name, build, good, bad, message", TRACED_CHECKS, ids=[c[0] for c in TRACED_CHECKS])
def test_check_holds_under_jit(name, build, good, bad, message):
    """Refused eagerly with a PolarizeError, and at run time under jit with the same message."""
    jitted = jax.jit(build)
    jax.block_until_ready(jitted(jnp.asarray(good)))  # a good value passes
    with pytest.raises(pz.PolarizeError, match=message):
        build(bad)  # concrete: refused now
    with pytest.raises(RUNTIME, match=message):
        jax.block_until_ready(jitted(jnp.asarray(bad)))


@pytest.mark.parametrize(
    "args, message",
    [
        ((0.0, "1e3"), "`t1` must be a finite number; got '1e3'"),
        ((None, 1.0), "`t0` must be a finite number; got None"),
        ((0.0, [1.0]), "`t1` must be a finite number; got [1.0]"),
        ((0.0, 1.0, np.array(["0", "a"])), "`ts` must be a 1-D array of finite times"),
        ((0.0, 1.0, [0.0, "a"]), "`ts` must be a 1-D array of finite times"),
    ],
)
def test_times_that_are_not_numbers_are_refused_by_name(args, message):
    with pytest.raises(pz.PolarizeError, match=re.escape(message)):
        check_times(*args)


def test_traced_save_times_outside_the_horizon_are_refused_not_clipped():
    """The t = 10 state can no longer come back labelled t = 1000."""
    model, obj = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(0, 2)
    run = jax.jit(lambda ts, t1: pz.flow(model, obj, t1=t1, ts=ts).weights)
    inside = run(jnp.array([0.0, 5.0, 10.0]), 10.0)
    ref = pz.flow(model, obj, t1=10.0, ts=[0.0, 5.0, 10.0]).weights
    np.testing.assert_allclose(inside, ref, rtol=1e-12, atol=1e-14)
    with pytest.raises(RUNTIME, match=r"`ts` must be non-decreasing and lie in \[t0, t1\]"):
        jax.block_until_ready(run(jnp.array([0.0, 5.0, 1000.0]), 10.0))


def test_float32_horizon_beyond_its_range_is_refused():
    model, obj = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(0, 2)
    with pytest.raises(pz.PolarizeError, match="`t1` must be below 1.7e\\+38 for a float32 flow"):
        pz.flow(model, obj, t1=1e40, precision="float32")
    with pytest.raises(pz.PolarizeError, match="`t1` must be below"):
        pz.modified_flow(model, obj, 0.1, t1=1e40, precision="float32")
    # a horizon float32 holds still runs in float32, and float64 takes 1e40 (test_paper_claims)
    traj = pz.flow(model, obj, t1=1e30, n_save=2, precision="float32")
    assert traj.V.dtype == jnp.float32 and bool(np.all(traj.ok))


def test_a_solver_or_adjoint_that_is_not_diffraxs_is_refused_by_name():
    # a name where a diffrax object belongs once failed deep in the stiff controller
    # with an AttributeError; now the argument and what it takes are named at once
    model, obj = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(0, 2)
    with pytest.raises(pz.PolarizeError, match=r"`solver` must be a diffrax solver such as diffrax\.Tsit5"):
        pz.flow(model, obj, t1=10.0, solver="tsit5")
    with pytest.raises(pz.PolarizeError, match="`adjoint` must be a diffrax adjoint"):
        pz.flow(model, obj, t1=10.0, adjoint="backsolve")
    with pytest.raises(pz.PolarizeError, match="`solver` must be a diffrax solver"):
        pz.SolveOptions(t1=10.0, solver=diffrax.Tsit5)  # the class, not an instance


def test_conflicting_learning_rates_are_refused():
    model, obj = pz.init_ensemble(0, 2, tokens=3, dim=2), pz.random_direction(0, 2)
    with pytest.raises(pz.PolarizeError, match="`lr`=0.5 conflicts with the learning rate 0.1"):
        pz.descend(model, obj, 0.1, steps=3, lr=0.5)
    same = pz.descend(model, obj, 0.1, steps=3, lr=0.1, n_save=2)
    np.testing.assert_allclose(same.ts, [0.0, 0.3])


def test_reduced_field_holds_for_a_direction_of_any_length():
    """The reduced field does not assume |b| = 1: with b replaced by 3b it still equals autodiff."""
    model = pz.init_ensemble(0, 3, tokens=4, dim=3, v_scale=0.5, a_scale=0.5)
    obj = eqx.tree_at(lambda o: o.b, pz.random_direction(1, 3), 3.0 * pz.random_direction(1, 3).b)
    kw = dict(t1=50.0, n_save=4, rtol=1e-12, atol=1e-14)
    fast, ref = pz.flow(model, obj, path="reduced", **kw), pz.flow(model, obj, path="autodiff", **kw)
    np.testing.assert_allclose(fast.V, ref.V, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fast.a, ref.a, rtol=0, atol=1e-8)
    gd, gd_ref = (pz.descend(model, obj, 0.05, steps=50, n_save=2, path=p) for p in ("reduced", "autodiff"))
    np.testing.assert_allclose(gd.V, gd_ref.V, rtol=0, atol=1e-12)


def test_checks_on_concrete_values_compile_no_program():
    """Concrete values are checked with numpy on the host: a fresh process used to compile
    one small XLA program per check and shape (~20 at a sweep's start, 20-60 ms each)."""
    from polarize.core._models import finite
    from polarize.core._refuse import refuse_if

    compiled, listening = [], [True]

    def listen(event, duration, **kw):
        if listening[0] and event == "/jax/core/compile/backend_compile_duration":
            compiled.append(duration)

    V = jnp.asarray(np.linspace(-1.0, 1.0, 5 * 13).reshape(5, 13))  # a shape no test uses
    times = (jnp.asarray(0.25), jnp.asarray(0.75))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        assert finite("V", V) is V
        with pytest.raises(pz.PolarizeError, match="`V` contains NaN or Inf"):
            finite("V", np.where(np.arange(65).reshape(5, 13) == 7, np.nan, 1.0))
        assert refuse_if(times, lambda t, xp: ~(t[1] > t[0]), "order") is times
        with pytest.raises(pz.PolarizeError, match="order"):
            refuse_if(times[::-1], lambda t, xp: ~(t[1] > t[0]), "order")
    finally:
        listening[0] = False
    assert compiled == []


@pytest.mark.parametrize("name, build, good, bad, message", TRACED_CHECKS, ids=[c[0] for c in TRACED_CHECKS])
def test_check_on_accelerator_values_refuses_with_jax_numpy(name, build, good, bad, message, monkeypatch):
    """Concrete values on an accelerator are checked there with jax.numpy, not copied to the
    host: the same checks, the same messages (the branch forced here, as CPU runs lack one)."""
    from polarize.core import _refuse as errors

    on_host = []
    monkeypatch.setattr(errors, "_in_host_memory", lambda leaf: on_host.append(leaf) and False)
    jax.block_until_ready(build(jnp.asarray(good)))
    with pytest.raises(pz.PolarizeError, match=message):
        build(jnp.asarray(bad))
    assert on_host  # the check asked where its values live
