"""Polarization speed: when each initialization reaches a level (the rate: `polarize.measure`).

Hitting times of gradient flow are exact to the solver's tolerance, not interpolated
between saved times. Two ways:

`flow_with_hitting_times` (what sweeps run) takes them from the solve itself: the
engine's batched loop checks every accepted step, keeps the first that reaches each
level, and locates the crossing on that step's dense output (`_engine.integrate`'s
`crossings`, Chandrupatla's method). Only a crossing undone inside one solver step is
missed. Solvers outside the batched loop (implicit, Rosenbrock-W: the stiff default)
restart instead, as `hitting_times` does.

`hitting_times(traj, ...)` works from any trajectory. The saved trajectory only
brackets the first crossing: the first saved interval [t_{k-1}, t_k] whose end reached
the level. The ODE is autonomous, so the solve restarts from the saved state at
t_{k-1} over that one interval (on the clock tau = log(1 + t), like `flow`, and with
flow's own vector field: in reduced coordinates where they apply), with a diffrax
`Event` whose root is located on the solver's dense solution by the same root finder
as the batched loop's (`_roots`, Chandrupatla's method).

Caveat of the bracketing: a crossing that uncrosses again between two saved times
(max weight above the level and back below it inside one interval) is missed, and
the time reported is that of a later crossing, or inf. More saved times (`n_save`)
shrink the intervals.

For gradient descent the time of a level is the first step index k whose iterate
reached it, times lr, tracked by `descend` in the same scan that steps it
(`descent_hitting_times` and `descend_with_hitting_times` live beside `descend` in
`_descent`, so that a flow never loads optax).
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..core._batching import blockwise, exact_matmuls, partition_inits
from ..core._choices import LEVELS, LOSS_FRACTION, check_levels, time_names
from ..core._errors import PolarizeError
from ..core._models import AbstractModel
from ..core._objectives import AbstractObjective
from ..core._trajectory import Trajectory, observe
from ..core.fields import choose_field
from ._flow import solve_flow
from ._options import USER_SETTINGS, SolveOptions, Targets
from ._roots import Chandrupatla


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
    unknown = sorted(set(options) - set(USER_SETTINGS))
    if unknown:
        raise PolarizeError(f"unknown option(s) {unknown} for `flow`; valid: {sorted(USER_SETTINGS)}")
    options = SolveOptions(t1=t1, targets=Targets.of(levels, loss_fraction), **options)
    names = time_names(check_levels(levels), loss_fraction)
    traj, times = flow_and_crossings(model, objective, options, names)
    if times is None:  # not the batched loop: restart over the saved intervals
        times = restarted_hitting_times(traj, model, objective, options, names)
    return traj, times


def flow_and_crossings(model, objective, options: SolveOptions, names, *, reduce=None):
    """(trajectory, {name: hitting times}) where the batched loop located the crossings of
    `options.targets` (named `names`), else (trajectory, None).

    With `reduce` (see `solve_flow`) and crossings from the loop, the dict of its
    outputs (with `ok`, `status` and `steps`) comes in place of the trajectory.
    """
    traj, crossed = solve_flow(model, objective, options, reduce=reduce)
    if crossed is None:
        return traj, None
    return traj, {name: crossed[..., j] for j, name in enumerate(names)}


def restarted_hitting_times(traj, model, objective, options: SolveOptions, names) -> dict:
    """The hitting times of `options.targets` (named `names`) on a flow trajectory of
    `model`, each restarted from the saved state before its first saved crossing with
    `options.restart_solver()` and the options' tolerances."""
    per_init = (traj.value_path, traj.a, traj.weights, traj.loss, traj.ok)
    if not traj.batched:
        per_init = jax.tree.map(lambda x: x[None], per_init)
    solver = options.restart_solver()
    args = (options.targets, solver, options.rtol, options.atol, options.max_steps)
    out = _hitting(model, objective, traj.ts, per_init, *args)
    out = out if traj.batched else out[0]
    return {name: out[..., j] for j, name in enumerate(names)}


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
    options = SolveOptions(
        t1=traj.ts[-1],
        solver=solver,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        targets=Targets.of(levels, loss_fraction),
    )
    names = time_names(check_levels(levels), loss_fraction)
    return restarted_hitting_times(traj, model, objective, options, names)


@eqx.filter_jit
@exact_matmuls
def _hitting(model, objective, ts, per_init, targets, solver, rtol, atol, max_steps):
    (model_dyn, model_static), (obj_dyn, obj_static) = partition_inits(model), partition_inits(objective)
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
        restart = model.at_state(path.at(start), a[start])
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
            event=diffrax.Event(gap, root_finder=Chandrupatla(), direction=True),
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
