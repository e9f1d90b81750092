"""Discrete descent: GD tracks the flow at O(lr), optimizers run per initialization, divergence is flagged."""

import jax
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


def test_descents_that_differ_only_in_lr_share_one_program(compiles):
    """Plain gradient descent's learning rate is data: a second rate runs the first rate's
    compiled program, and its iterates are theta <- theta - lr grad L stepped by hand."""
    model = pz.init_ensemble(5, 3, tokens=4, dim=3, v_scale=0.5, a_scale=0.3)
    obj = pz.random_direction(2, 3)
    pz.descend(model, obj, 0.1, steps=6, save_at=[0, 6])
    traj, compiled = compiles.counting(pz.descend, model, obj, 0.35, steps=6, save_at=[0, 6])
    assert not [name for name in compiled if "_descend" in name], compiled
    np.testing.assert_allclose(traj.ts, [0.0, 6 * 0.35])
    for i in range(3):
        theta = (model.V[i], model.a[i])
        for _ in range(6):
            grads = pz.fields.gradient(pz.ValueAttention(*theta, model.norm), obj)
            theta = jax.tree.map(lambda p, g: p - 0.35 * g, theta, grads)
        np.testing.assert_allclose(traj.V[i, -1], theta[0], rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(traj.a[i, -1], theta[1], rtol=1e-10, atol=1e-13)


def test_a_first_descent_compiles_its_solve_and_one_finishing_program(compiles):
    """The saved times, the divergence check and the statuses after the solve are one
    program, not one per operation (ten small compiles on a first call before); the
    hitting times' too. Shapes no other test uses, so that nothing is compiled already."""
    model = pz.init_ensemble(5, 7, tokens=9, dim=3, v_scale=0.5, a_scale=0.3)
    obj = pz.random_direction(2, 3)
    (traj, times), compiled = compiles.counting(
        pz.descend_with_hitting_times, model, obj, 0.4, steps=50, levels=(0.6,), loss_fraction=None
    )
    # (`jit(stage)`: the learning rate made a device scalar, one program per process)
    programs = sorted(name for name in compiled if name != "jit(stage)")
    assert programs == ["jit(_descend)", "jit(_hitting_times)", "jit(_times_and_status)"], compiled
    np.testing.assert_array_equal(traj.status, pz.status.OK)
    np.testing.assert_allclose(traj.ts, 0.4 * np.asarray(traj.steps), rtol=0, atol=0)
    assert np.all(np.isfinite(times["time_to_0.6"]) | np.isinf(times["time_to_0.6"]))


@pytest.mark.parametrize("optimizer", [optax.sgd(0.05, momentum=0.9), optax.adam(0.01)])
def test_momentum_and_adam_polarize_softmax(optimizer):
    model = pz.init_ensemble(0, 16, tokens=6, dim=6)
    traj = pz.descend(model, pz.random_direction(1, 6), optimizer, steps=3000, n_save=8)
    s = pz.summarize(traj, pz.random_direction(1, 6))
    assert s.aggregates["n_failed"] == 0
    assert s.aggregates["median_max_weight"] > 0.8


@pytest.mark.parametrize("optimizer", [optax.adam(0.01), 0.3], ids=["adam", "gd"])
def test_the_saved_steps_do_not_change_the_iterates(optimizer):
    """Which steps are saved does not change the iterates, to the bit, and they match a
    Python loop. (With one scan per segment between saved steps, the square objective's
    iterate at step 300 moved with the saved steps, for Adam and for GD alike: each
    segment was its own compiled loop.)"""
    model = pz.init_ensemble(3, 6, tokens=4, dim=3, v_scale=0.5, a_scale=0.3)
    obj = pz.conditioned_regression(2, 8, 3, 3.0)
    run = lambda save_at: pz.descend(model, obj, optimizer, steps=300, save_at=save_at)
    ends, mid = run([0, 300]), run([0, 7, 17, 30, 31, 300])
    np.testing.assert_array_equal(mid.V[:, -1], ends.V[:, -1])
    np.testing.assert_array_equal(mid.a[:, -1], ends.a[:, -1])
    opt = optax.sgd(optimizer) if isinstance(optimizer, float) else optimizer

    @jax.jit
    def step(theta, state):
        grads = pz.fields.gradient(pz.ValueAttention(*theta, model.norm), obj)
        updates, state = opt.update(grads, state, theta)
        return optax.apply_updates(theta, updates), state

    theta = (model.V[0], model.a[0])
    state = opt.init(theta)
    for k in range(1, 301):
        theta, state = step(theta, state)
        if k in (30, 300):
            np.testing.assert_allclose(mid.V[0, 3 if k == 30 else -1], theta[0], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(mid.a[0, 3 if k == 30 else -1], theta[1], rtol=1e-9, atol=1e-12)


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


# First hits of hitting-time targets, tracked by descent on its own iterates.

LEVELS, LOSS_FRACTION = (0.2, 0.5, 0.9, 0.999), 0.05  # 0.2 < 1/4: reached at the start


def _first_hits_by_hand(model, obj, optimizer, steps):
    """The first step index reaching each target, one initialization at a time: optax
    steps on (V, a) with `jax.grad`, weights and loss read from the rebuilt model."""
    first = np.full((model.V.shape[0], len(LEVELS) + 1), -1)
    for i in range(model.V.shape[0]):
        theta = (model.V[i], model.a[i])
        state = optimizer.init(theta)

        @jax.jit
        def step(theta, state):
            grads = pz.fields.gradient(pz.ValueAttention(*theta, model.norm), obj)
            updates, state = optimizer.update(grads, state, theta)
            return optax.apply_updates(theta, updates), state

        loss0 = None
        for k in range(steps + 1):
            m = pz.ValueAttention(*theta, model.norm)
            w, loss = np.asarray(m.weights()), float(obj(m()))
            loss0 = loss if loss0 is None else loss0
            reached = [np.max(np.abs(w) / np.sum(np.abs(w))) >= lv for lv in LEVELS]
            reached.append(loss <= LOSS_FRACTION * loss0)
            first[i] = np.where((first[i] < 0) & np.array(reached), k, first[i])
            theta, state = step(theta, state)
    return first


@pytest.mark.parametrize(
    "objective, optimizer, path",
    [
        ("direction", 0.5, "auto"),  # plain GD in the reduced coordinates (u, a)
        ("direction", 0.5, "autodiff"),
        ("regression", 0.3, "auto"),  # plain GD in the data's span (W, a)
        ("direction", optax.sgd(0.2, momentum=0.9), "auto"),  # per-leaf optimizer state
    ],
)
def test_descend_first_hits_equal_a_python_loop(objective, optimizer, path):
    """descend(..., targets=...) against hand-written steps, checked at k = 0..steps;
    the trajectory stays the one without targets, bit for bit."""
    from polarize.solve._options import Targets

    model = pz.init_ensemble(2, 3, tokens=4, dim=3, v_scale=0.5)
    obj = pz.random_direction(1, 3) if objective == "direction" else pz.conditioned_regression(0, 2, 3, 2.0)
    steps = 150
    targets = Targets.of(LEVELS, LOSS_FRACTION)
    # saved steps end before `steps`: the hits are still tracked to the end
    options = dict(steps=steps, save_at=[0, 5, 12], path=path)
    traj, first = pz.descend(model, obj, optimizer, **options, targets=targets)
    plain = pz.descend(model, obj, optimizer, **options)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(traj)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    sgd = optax.sgd(optimizer) if isinstance(optimizer, float) else optimizer
    expected = _first_hits_by_hand(model, obj, sgd, steps)
    assert first.shape == (3, len(LEVELS) + 1)
    np.testing.assert_array_equal(first, expected)
    assert (expected[:, 0] == 0).all() and (expected > 12).any()  # at the start; past the last save
    assert (expected[:, 3] == -1).all()  # never reached


def test_first_hits_do_not_depend_on_block_size_batch_or_threads(monkeypatch):
    from polarize.solve._descent import descend_with_hitting_times
    from polarize.solve._options import Targets

    model = pz.init_ensemble(4, 10, tokens=5, dim=4, v_scale=0.5)
    obj = pz.random_direction(3, 4)
    targets = Targets.of((0.5, 0.9), 0.1)
    run = lambda m, **kw: pz.descend(m, obj, 0.5, steps=400, n_save=6, targets=targets, **kw)
    traj, first = run(model, block_size=4)
    assert (first >= 0).any() and (first < 0).any()
    for block_size in (3, 16):
        np.testing.assert_array_equal(run(model, block_size=block_size)[1], first)
    part = lambda i: pz.ValueAttention(model.V[i], model.a[i], model.norm)
    np.testing.assert_array_equal(run(part(slice(2, 5)), block_size=4)[1], first[2:5])
    np.testing.assert_array_equal(run(part(7))[1], first[7])  # one unbatched initialization
    monkeypatch.setenv("POLARIZE_THREADS", "2")  # chunks of blocks side by side in threads
    threaded, first_threaded = run(model, block_size=4)
    np.testing.assert_array_equal(first_threaded, first)
    plain = pz.descend(model, obj, 0.5, steps=400, n_save=6, block_size=4)
    np.testing.assert_array_equal(threaded.V, plain.V)
    # the hitting times are those indices x lr (inf: never reached)
    _, times = descend_with_hitting_times(model, obj, 0.5, steps=400, levels=(0.5, 0.9), loss_fraction=0.1)
    assert list(times) == ["time_to_0.5", "time_to_0.9", "time_to_loss_0.1"]
    for j, name in enumerate(times):
        np.testing.assert_array_equal(times[name], np.where(first[:, j] >= 0, first[:, j] * 0.5, np.inf))


def test_a_descent_that_runs_away_is_diverged_not_ok():
    # lr 3 on a square loss of curvature up to 2 sigma_max^2 = 8 overshoots every step: the
    # loss grows to 1e72-1e127, finite, so only the rise can tell
    model, obj = pz.init_ensemble(0, 4, tokens=4, dim=3, v_scale=1.0), pz.conditioned_regression(0, 3, 3, 2.0)
    away = pz.descend(model, obj, 3.0, steps=100, n_save=5)
    assert np.all(np.isfinite(away.loss)) and np.all(away.loss[:, -1] > 1e6 * away.loss[:, 0])
    np.testing.assert_array_equal(away.status, pz.status.DIVERGED)
    assert not np.any(away.ok)
    summary = pz.summarize(away, obj)
    assert summary.aggregates["n_failed"] == summary.aggregates["failed_diverged"] == 4
    assert summary.aggregates["one_hot_fraction"] is None  # nothing left to average
    calm = pz.descend(model, obj, 0.05, steps=100, n_save=5)  # the same problem, a stable rate
    np.testing.assert_array_equal(calm.status, pz.status.OK)
    assert np.all(calm.loss[:, -1] < calm.loss[:, 0])


def test_hitting_times_of_an_optax_descent_are_step_indices():
    # k x lr has no lr with an optax optimizer (it raised a JAX TypeError): k, as traj.ts
    model, obj = pz.init_ensemble(0, 3, tokens=4, dim=3, v_scale=0.5), pz.random_direction(1, 3)
    traj, times = pz.descend_with_hitting_times(model, obj, optax.adam(0.2), steps=40, levels=(0.5,))
    k = times["time_to_0.5"]
    assert np.all(np.isfinite(k)) and np.all(k == np.round(k))
    # the first step whose iterate reaches 0.5, from a Python loop over the saved steps of every step
    every = pz.descend(model, obj, optax.adam(0.2), steps=40, save_at=list(range(41)))
    np.testing.assert_array_equal(k, np.argmax(np.asarray(every.weights).max(-1) >= 0.5, axis=-1))
    np.testing.assert_array_equal(traj.ts, traj.steps)  # the trajectory's clock is the step index
