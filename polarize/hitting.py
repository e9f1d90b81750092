"""Polarization speed: when each initialization reaches a level, and its asymptotic rate.

Hitting times of gradient flow are exact to the solver's tolerance, not interpolated
between saved times. Two ways:

`flow_with_hitting_times` (what sweeps run) takes them from the solve itself: the
engine's batched loop checks every accepted step, keeps the first that reaches each
level, and locates the crossing on that step's dense output (`engine.integrate`'s
`crossings`). Only a crossing undone inside one solver step is missed.

`hitting_times(traj, ...)` works from any trajectory. The saved trajectory only
brackets the first crossing: the first saved interval [t_{k-1}, t_k] whose end reached
the level. The ODE is autonomous, so the solve restarts from the saved state at
t_{k-1} over that one interval (on the clock tau = log(1 + t), like `flow`, and with
flow's own vector field: in reduced coordinates where they apply), with a diffrax
`Event` whose root is located by bisection on the solver's dense solution.

Caveat of the bracketing: a crossing that uncrosses again between two saved times
(max weight above the level and back below it inside one interval) is missed, and
the time reported is that of a later crossing, or inf. More saved times (`n_save`)
shrink the intervals.

For gradient descent (`descent_hitting_times`) the time of a level is the first
step index k whose iterate reached it, times lr.
"""

import inspect

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimistix as optx
from jaxtyping import Array, Float, Int

from .ensembles import batch_axes, blockwise, exact_matmuls, over_inits
from .errors import PolarizeError
from .fields import choose_field
from .flow import flow, integrate_flow
from .models import AbstractModel, with_params
from .objectives import AbstractObjective
from .statistics import distribution
from .trajectory import Trajectory, observe

#: Default max-weight levels.
LEVELS = (0.5, 0.9, 0.99)
#: Default loss level, as a fraction of the loss at the start.
LOSS_FRACTION = 1e-3


def check_levels(levels) -> tuple[float, ...]:
    """`levels` as a sorted tuple of distinct floats in (0, 1], or a `PolarizeError`."""
    try:
        values = tuple(float(x) for x in np.atleast_1d(np.asarray(levels, dtype=float)))
    except (TypeError, ValueError):
        raise PolarizeError(f"`levels` must be numbers in (0, 1]; got {levels!r}") from None
    bad = [x for x in values if not 0 < x <= 1]
    if not values or bad:
        raise PolarizeError(f"`levels` must be numbers in (0, 1]; got {list(values)!r}")
    return tuple(sorted(set(values)))


def time_names(levels=LEVELS, loss_fraction: float | None = LOSS_FRACTION) -> list[str]:
    """Names of the hitting times: `time_to_<level>` and `time_to_loss_<fraction>`."""
    names = [f"time_to_{level:g}" for level in levels]
    if loss_fraction is not None:
        names.append(f"time_to_loss_{loss_fraction:g}")
    return names


class Targets(eqx.Module):
    """What the hitting times measure: kind 0 is a max-weight level, kind 1 a loss fraction.

    Arrays, not static settings, so new levels reuse the compiled program.
    """

    kinds: Int[Array, " targets"]
    values: Float[Array, " targets"]

    def levels(self, model: AbstractModel, objective: AbstractObjective) -> Float[Array, " targets"]:
        """The levels of one initialization: loss fractions become losses (of L at the start)."""
        return self.per_init(objective(model()))

    def per_init(self, loss0) -> Float[Array, " targets"]:
        return jnp.where(self.kinds == 0, self.values, self.values * loss0).astype(loss0.dtype)

    def from_observed(self, weights, loss, levels):
        """g_j >= 0 exactly when target j is reached (max weight - level, or level - loss),
        from weights (..., tokens) and loss (...): (targets, ...)."""
        max_weight = jnp.max(distribution(weights), axis=-1)
        pad = lambda x: x.reshape(x.shape + (1,) * max_weight.ndim)  # targets in front
        grow = lambda x: x.reshape((1,) * self.kinds.ndim + x.shape)
        return jnp.where(pad(self.kinds) == 0, grow(max_weight) - pad(levels), pad(levels) - grow(loss))


def _targets(levels, loss_fraction) -> Targets:
    kinds = [0] * len(levels) + ([1] if loss_fraction is not None else [])
    values = list(levels) + ([loss_fraction] if loss_fraction is not None else [])
    return Targets(jnp.asarray(kinds), jnp.asarray(values, dtype=float))


def _check(levels, loss_fraction) -> tuple[float, ...]:
    levels = check_levels(levels)
    if loss_fraction is not None and not 0 < loss_fraction < 1:
        raise PolarizeError(f"`loss_fraction` must be in (0, 1); got {loss_fraction!r}")
    return levels


def flow_with_hitting_times(
    model: AbstractModel,
    objective: AbstractObjective,
    *,
    t1: float,
    levels=LEVELS,
    loss_fraction: float | None = LOSS_FRACTION,
    **options,
) -> tuple[Trajectory, dict[str, Float[Array, "*inits"]]]:
    """`flow(model, objective, t1=t1, **options)` and its hitting times, from one solve.

    Where the flow runs the engine's batched loop (explicit Runge-Kutta solvers, the
    default Tsit5 on the paper's logistic objectives), every accepted step is checked:
    the first step that reaches a level is kept and the crossing is located on that
    step's dense output (Chandrupatla's method, to rounding). A crossing that uncrosses
    within a saved interval is then found too. Elsewhere (implicit and Rosenbrock
    solvers) this is `flow` followed by `hitting_times` with the same solver and
    tolerances.

    Returns:
        (trajectory, {"time_to_<level>": ..., "time_to_loss_<fraction>": ...}), times as
        for `hitting_times`, except that inf means never reached by t1.
    """
    traj, times = flow_and_crossings(
        model, objective, t1=t1, levels=levels, loss_fraction=loss_fraction, **options
    )
    if times is None:  # not the batched loop: restart over the saved intervals
        times = restarted_hitting_times(traj, model, objective, levels, loss_fraction, options)
    return traj, times


def flow_and_crossings(
    model, objective, *, t1, levels=LEVELS, loss_fraction=LOSS_FRACTION, reduce=None, **options
):
    """(trajectory, hitting times) where the batched loop located them, else (trajectory, None).

    `options` are `flow`'s keyword arguments (its own defaults apply). With `reduce`
    (see `flow.integrate_flow`) and hitting times, the dict of its outputs (with `ok`,
    `status` and `steps`) comes in place of the trajectory.
    """
    levels = _check(levels, loss_fraction)
    defaults = {
        name: p.default
        for name, p in inspect.signature(flow).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name != "t1"
    }
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise PolarizeError(f"unknown option(s) {unknown} for `flow`; valid: {sorted(defaults)}")
    o = {**defaults, **options}
    positional = [o.pop(k) for k in ("t0", "n_save", "ts", "path", "precision", "block_size")]
    traj, crossed = integrate_flow(
        model, objective, t1, *positional, targets=_targets(levels, loss_fraction), reduce=reduce, **o
    )
    if crossed is None:
        return traj, None
    names = time_names(levels, loss_fraction)
    return traj, {name: crossed[..., j] for j, name in enumerate(names)}


def restarted_hitting_times(traj, model, objective, levels, loss_fraction, options: dict) -> dict:
    """`hitting_times` of a flow trajectory with the solver and tolerances of `options`
    (`flow`'s keyword arguments; the flow's defaults where absent)."""
    import inspect

    from .flow import flow

    defaults = inspect.signature(flow).parameters
    pick = lambda k: options.get(k, defaults[k].default)
    return hitting_times(
        traj,
        model,
        objective,
        levels=levels,
        loss_fraction=loss_fraction,
        solver=pick("solver"),
        rtol=pick("rtol"),
        atol=pick("atol"),
        max_steps=pick("max_steps"),
    )


def hitting_times(
    traj: Trajectory,
    model: AbstractModel,
    objective: AbstractObjective,
    *,
    levels=LEVELS,
    loss_fraction: float | None = LOSS_FRACTION,
    solver: diffrax.AbstractSolver | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
) -> dict[str, Float[Array, "*inits"]]:
    """First times max weight reaches each level, and the loss falls to `loss_fraction` of L(0).

    Args:
        traj: a `flow` trajectory of `model` under `objective` (log-spaced saves work best).
        model, objective: what `traj` integrated (batched or not), with the initial state.
        levels: max-weight levels in (0, 1]; max weight is read on p = |s| / sum |s|.
        loss_fraction: the loss level as a fraction of the initial loss (None: skip it).
        solver, rtol, atol, max_steps: for the restarted solves, each over one save
            interval on the log clock. None: Tsit5, whatever method made `traj` (each
            restart is its own exact solve to rtol/atol; the stiff default of square and
            cross-entropy flows is not needed for the transient where levels are crossed).

    Returns:
        {"time_to_<level>": ..., "time_to_loss_<fraction>": ...}, each (inits,) or a
        scalar: the flow time of the first crossing (t0 when reached at the start), inf
        where never reached by the last saved time, NaN where the run failed (`ok` False).
    """
    levels = _check(levels, loss_fraction)
    solver = diffrax.Tsit5() if solver is None else solver
    names = time_names(levels, loss_fraction)
    per_init = (traj.value_path, traj.a, traj.weights, traj.loss, traj.ok)
    if not traj.batched:
        per_init = jax.tree.map(lambda x: x[None], per_init)
    targets = _targets(levels, loss_fraction)
    out = _hitting(model, objective, traj.ts, per_init, targets, solver, rtol, atol, max_steps)
    out = out if traj.batched else out[0]
    return {name: out[..., j] for j, name in enumerate(names)}


def _split(module):
    """(batched arrays, the rest) of a model or objective, for mapping over initializations."""
    is_none = lambda x: x is None
    return eqx.partition(module, jax.tree.map(lambda ax: ax == 0, batch_axes(module), is_leaf=is_none))


@eqx.filter_jit
@exact_matmuls
def _hitting(model, objective, ts, per_init, targets, solver, rtol, atol, max_steps):
    (model_dyn, model_static), (obj_dyn, obj_static) = _split(model), _split(objective)
    n = per_init[0].shape[0]
    model_dyn = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape[1:]), model_dyn)
    obj_dyn = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape[1:]), obj_dyn)

    def one(args):
        model_dyn, obj_dyn, (path, a, weights, loss, ok) = args
        model, objective = eqx.combine(model_dyn, model_static), eqx.combine(obj_dyn, obj_static)
        return _first_crossings(
            model,
            objective,
            ts,
            path,
            a,
            weights,
            loss,
            ok,
            targets,
            solver,
            rtol,
            atol,
            max_steps,
        )

    return blockwise(one, (model_dyn, obj_dyn, per_init))


#: Root finder on the solver's dense solution. An upcrossing (the gap goes from < 0 to
#: >= 0) needs no sign detection (`flip=False`), which would fail under `vmap` for
#: lanes without an event; bisection also works inside `shard_map`, where Newton's
#: closure-converted Jacobian does not (JAX 0.10, optimistix 0.1).
_BISECTION = optx.Bisection(rtol=1e-13, atol=1e-13, flip=False)


def _first_crossings(
    model, objective, ts, path, a, weights, loss, ok, targets, solver, rtol, atol, max_steps
):
    """Hitting times of one initialization (one entry per target)."""
    kinds, values = targets.kinds, targets.per_init(loss[0])
    hit = targets.from_observed(weights, loss, values) >= 0  # (targets, times)
    reached = jnp.any(hit, axis=-1)
    k = jnp.argmax(hit, axis=-1)
    # a failed run or a target reached at the start needs no solve: it restarts
    # from the (finite) initial state over the first interval, and its result is discarded
    needs_solve = ok & reached & (k > 0)
    start = jnp.where(needs_solve, k - 1, 0)
    stop = jnp.where(needs_solve, k, 1)

    # the flow's own vector field (`fields.choose_field`), restarted from the saved state:
    # in reduced coordinates where they apply, a fraction of the size of (V, a)
    field = choose_field(model, objective)

    def locate(kind, value, start, stop):
        restart = with_params(model, (path.at(start), a[start]))
        constants = field.constants(restart, objective)

        def vector_field(tau, y, args):  # d y / d tau = (1 + t) dy/dt, t = exp(tau) - 1
            return jax.tree.map(lambda d: jnp.exp(tau) * d, field(y, restart, objective, constants))

        def gap(t, y, args, **kwargs):
            saved, logits = field.value_path(jax.tree.map(lambda x: x[None], y), restart, objective)
            weights, loss = observe(restart, objective, saved, logits)
            return Targets(kind, value).from_observed(weights[0], loss[0], value)

        tau0, tau1 = jnp.log1p(ts[start]), jnp.log1p(ts[stop])
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            solver,
            t0=tau0,
            t1=tau1,
            dt0=None,
            y0=field.initial(restart, objective),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            event=diffrax.Event(gap, root_finder=_BISECTION, direction=True),
            max_steps=max_steps,
            throw=False,
        )
        # no event inside the bracket (the level is touched within the solver's
        # tolerance at t_k): the crossing is t_k itself
        solved = (sol.result == diffrax.RESULTS.successful) | (sol.result == diffrax.RESULTS.event_occurred)
        return jnp.where(solved, jnp.expm1(sol.ts[-1]), jnp.nan)

    located = jax.vmap(locate)(kinds, values, start, stop)
    times = jnp.where(k == 0, ts[0], located)
    times = jnp.where(reached, times, jnp.inf)
    return jnp.where(ok, times, jnp.nan)


def descent_hitting_times(
    model: AbstractModel,
    objective: AbstractObjective,
    lr: float,
    *,
    steps: int,
    levels=LEVELS,
    loss_fraction: float | None = LOSS_FRACTION,
) -> dict[str, Float[Array, "*inits"]]:
    """For plain gradient descent at `lr`: the first step index k whose iterate reaches
    each level (k = 0 is the start), times lr; inf where not reached within `steps`.

    Reruns the descent theta <- theta - lr grad L (optax.sgd) carrying the first-hit
    index of every target; the iterates are those of `polarize.descend` up to rounding
    (descend may step in reduced coordinates), so an index can differ only where an
    iterate lies within rounding of a level. NaN where an iterate went non-finite.
    """
    levels = _check(levels, loss_fraction)
    if not lr > 0:
        raise PolarizeError(f"`lr` must be a positive finite number; got {lr!r}")
    steps = int(steps)
    names = time_names(levels, loss_fraction)
    first, ok = _descent_first(model, objective, optax.sgd(lr), steps, _targets(levels, loss_fraction))
    times = jnp.where(first >= 0, first * lr, jnp.inf)
    times = jnp.where(ok[..., None], times, jnp.nan)
    return {name: times[..., j] for j, name in enumerate(names)}


@eqx.filter_jit
@exact_matmuls
def _descent_first(model, objective, optimizer, steps, targets):
    def run_one(model, objective):
        theta = tuple(getattr(model, n) for n in model.trainable)
        values = targets.levels(model, objective)

        def check(first, theta, k):
            m = with_params(model, theta)
            hit = targets.from_observed(m.weights(), objective(m()), values) >= 0
            return jnp.where((first < 0) & hit, k, first)

        def step(carry, k):
            theta, opt_state, first = carry
            first = check(first, theta, k)
            grads = jax.grad(lambda y: objective(with_params(model, y)()))(theta)
            updates, opt_state = optimizer.update(grads, opt_state, theta)
            return (optax.apply_updates(theta, updates), opt_state, first), None

        first = -jnp.ones(targets.kinds.shape, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
        carry = (theta, optimizer.init(theta), first)
        (theta, _, first), _ = jax.lax.scan(step, carry, jnp.arange(steps, dtype=first.dtype))
        first = check(first, theta, jnp.asarray(steps, first.dtype))
        ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in theta]))
        return first, ok

    return over_inits(run_one, model, objective)


def logistic_rate(ts, max_weight, *, t1: float | None = None) -> dict[str, Array]:
    """C fitted from 1 - max s = C / (log t)^2 over the last decade [t1 / 10, t1] of the horizon.

    Per initialization, C is the geometric mean of (1 - max s(t)) (log t)^2 over the
    saved times in that decade; `rate_drift` is the relative change of that product
    from the decade's first to its last saved time.

    When the fit is meaningful: under a logistic loss, once the run has polarized
    (max weight near 1, one token winning), where 1 - max s ~ C / (log t)^2 holds up
    to O(log log t / log t) corrections; a `rate_drift` of a few percent says the
    horizon is in that regime, a large one that it is not (raise t1). It needs
    t1 >= 100 and at least two saved times in the decade, else NaN, as where
    max s = 1 in floating point or the run failed.

    Args:
        ts: saved times (times,). max_weight: (inits, times) or (times,).
        t1: the horizon (default: the last saved time).
    Returns:
        {"rate_C": (inits,), "rate_drift": (inits,)}.
    """
    ts = np.asarray(ts, dtype=float)  # concrete: the window is chosen here
    t1 = float(ts[-1] if t1 is None else t1)
    window = (ts >= t1 / 10) & (ts <= t1) & (ts > 1)
    mw = jnp.asarray(max_weight)
    if t1 < 100 or window.sum() < 2:
        nan = jnp.full(mw.shape[:-1], jnp.nan, dtype=mw.dtype)
        return {"rate_C": nan, "rate_drift": nan}
    gap = 1.0 - mw[..., np.flatnonzero(window)]
    product = gap * jnp.broadcast_to(np.log(ts[window]) ** 2, gap.shape)
    valid = jnp.all(jnp.isfinite(product) & (product > 0), axis=-1)
    safe = jnp.where(valid[..., None], product, 1.0)
    C = jnp.exp(jnp.mean(jnp.log(safe), axis=-1))
    drift = safe[..., -1] / safe[..., 0] - 1
    return {"rate_C": jnp.where(valid, C, jnp.nan), "rate_drift": jnp.where(valid, drift, jnp.nan)}
