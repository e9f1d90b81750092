"""The exact gradient flow dtheta/dt = -grad L(theta), and the modified flow of GD, by diffrax.

Polarization lives on a logarithmic clock (1 - max s ~ C / (log t)^2 under the
logistic loss), so by default the ODE is integrated in tau = log(1 + t):
dtheta/dtau = (1 + t) dtheta/dt. Horizons such as t = 1e30 then take a few hundred
steps and nothing overflows.

`flow` and `modified_flow` are two thin drivers over one solve: the common preamble
(`fields.prepare`), the time checks (`times.check_times`), then `engine.integrate` on
the chosen vector field (`polarize.fields`), in fixed blocks of initializations.
"""

from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from . import status as codes, stiff
from .engine import batches, integrate
from .ensembles import (
    Precision,
    batch_axes,
    ensemble_size,
    exact_matmuls,
    float_dtype,
    in_threads,
    over_inits,
)
from .errors import check_choice, check_positive, refuse_if, shown
from .fields import AbstractField, Modified, Path, prepare
from .models import AbstractModel, params, with_params
from .objectives import AbstractObjective
from .times import check_times
from .trajectory import Trajectory, all_finite

Clock = Literal["log", "linear"]


def flow(
    model: AbstractModel,
    objective: AbstractObjective,
    *,
    t1: float,
    t0: float = 0.0,
    n_save: int = 64,
    ts=None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    clock: Clock | None = None,
    path: Path = "auto",
    adjoint: diffrax.AbstractAdjoint | None = None,
    precision: Precision | None = None,
    block_size: int | None = None,
) -> Trajectory:
    """Integrate dtheta/dt = -grad L(theta) from t0 to t1 for every initialization.

    Args:
        model: a model, or a batch of them (leading inits axis).
        objective: the loss of beta; may be batched like the model.
        t1, t0: horizon and start (0 <= t0 < t1).
        n_save: number of saved times, evenly spaced in log(1 + t), when `ts` is None.
        ts: explicit save times in [t0, t1] instead.
        solver: any diffrax solver; default `stiff.default_method`: the Rosenbrock-W
            method of `polarize.stiff` for `Square` and `CrossEntropy` at long horizons
            (stiff once the loss converges), Tsit5 otherwise.
        rtol, atol: tolerances of the PID step-size controller.
        max_steps: per-initialization cap on solver steps.
        clock: "log" integrates in tau = log(1 + t), "linear" in t itself; default
            "linear" for `Square` and `CrossEntropy`, else "log".
        path: vector-field form, see `polarize.fields` ("auto" picks the cheapest).
        adjoint: diffrax adjoint for gradients through the solve (default: checkpointed).
        precision: "float32" or "float64" casts model and objective first; None (default)
            keeps the model's dtype (an ensemble built in float32 flows in float32).
        block_size: initializations per vmapped block (default `ensembles.BLOCK_SIZE`);
            results are bit-identical for a fixed block size whatever the batch size.

    Returns:
        A `Trajectory`. Every initialization gets a `polarize.status` code; a failed
        one (ok=False) leaves the rest of the batch unaffected.
    """
    options = dict(solver=solver, rtol=rtol, atol=atol, max_steps=max_steps, clock=clock, adjoint=adjoint)
    return integrate_flow(model, objective, t1, t0, n_save, ts, path, precision, block_size, **options)


def integrate_flow(
    model,
    objective,
    t1,
    t0,
    n_save,
    ts,
    path,
    precision,
    block_size,
    *,
    targets=None,
    reduce=None,
    **options,
):
    """`flow`'s body; with `targets` (see `polarize.hitting`) also their crossing times.

    `reduce(path, a, weights, loss, ok, objective)`, given with `targets`, maps ONE
    initialization's trajectory (times first) to the numbers kept of it. Where the
    crossings come from the batched loop, it runs on each block as soon as it is solved
    and the trajectories are never stored: the result is then a dict of its outputs
    with `ok`, `status` and `steps`, in place of the `Trajectory`.
    """
    model, objective, field, block_size = prepare(
        model, objective, path=path, precision=precision, block_size=block_size
    )
    if options["solver"] is None:  # stiff objectives: Rosenbrock-W on the linear clock
        options["solver"], default_clock = stiff.default_method(model, objective, field, t1)
        options["clock"] = options["clock"] or default_clock
    options["clock"] = options["clock"] or "log"
    return _solve(
        model,
        objective,
        field,
        t0,
        t1,
        n_save,
        ts,
        block_size=block_size,
        targets=targets,
        reduce=reduce,
        **options,
    )


def modified_flow(
    model: AbstractModel,
    objective: AbstractObjective,
    lr: float,
    *,
    t1: float,
    t0: float = 0.0,
    n_save: int = 64,
    ts=None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
    clock: Clock = "log",
    path: Path = "auto",
    adjoint: diffrax.AbstractAdjoint | None = None,
    precision: Precision | None = None,
    block_size: int | None = None,
) -> Trajectory:
    """Integrate the modified flow dtheta/dt = -grad(L + (lr/4)|grad L|^2) of gradient descent.

    Gradient descent at step size lr tracks the plain flow only to O(lr); it tracks this
    flow to O(lr^2) (backward error analysis: Hairer, Lubich & Wanner; Barrett & Dherin
    2021, "implicit gradient regularization"). Compare with
    `descend(model, objective, lr, steps=k)` at time t = k lr; lr = 0 gives the plain
    flow. Every other argument is as for `flow` (with tighter default tolerances); the
    field is `fields.Modified(lr, base)` on the `path` form, exact in reduced coordinates
    too because plain GD is the same iteration there.
    """
    bad = lambda lr, xp: ~(xp.isfinite(lr) & (xp.asarray(lr) >= 0))
    lr = refuse_if(lr, bad, f"`lr` must be a finite number >= 0; got {shown(lr)}")
    model, objective, base, block_size = prepare(
        model, objective, path=path, precision=precision, block_size=block_size
    )
    field = Modified(jnp.asarray(lr, float_dtype(model)), base)
    options = dict(solver=solver, rtol=rtol, atol=atol, max_steps=max_steps, clock=clock, adjoint=adjoint)
    return _solve(model, objective, field, t0, t1, n_save, ts, block_size=block_size, **options)


def _solve(model, objective, field, t0, t1, n_save, ts, *, block_size, targets=None, reduce=None, **options):
    """The options' checks, then one integration (the body both drivers share).

    Returns the `Trajectory`; with `targets`, (trajectory, crossing times or None where
    the engine does not run its batched loop).
    """
    check_choice("clock", options["clock"], ("log", "linear"))
    n_save = check_positive("n_save", n_save, integer=True)
    options["max_steps"] = check_positive("max_steps", options["max_steps"], integer=True)
    check_positive("rtol", options["rtol"])
    check_positive("atol", options["atol"])
    ends_only = ts is None and n_save == 2  # save t0 and t1 only: no dense interpolation
    t0, t1, ts = check_times(t0, t1, ts, n_save=n_save, dtype=float_dtype(model))
    if options["solver"] is None:
        options["solver"] = diffrax.Tsit5()
    if options["adjoint"] is None:
        options["adjoint"] = diffrax.RecursiveCheckpointAdjoint()
    single = ensemble_size(model, objective) is None
    if single:  # one initialization: a batch of one, in a block of one
        model, block_size = with_params(model, [p[None] for p in params(model)]), 1
    run = (field, ts, t0, t1, block_size, ends_only, targets, reduce)
    joined = None
    if targets is None:  # (targets may hold per-init levels: those flows run whole)
        shared = lambda out: out[0].ts  # every other leaf carries the inits axis
        joined = in_threads(_integrate, model, objective, *run, _block=block_size, _shared=shared, **options)
    traj, crossed = _integrate(model, objective, *run, **options) if joined is None else joined
    if single:
        shared = traj.ts if isinstance(traj, Trajectory) else None
        traj = jax.tree.map(lambda x: x if x is shared else x[0], traj)
        crossed = None if crossed is None else crossed[0]
    return traj if targets is None else (traj, crossed)


@eqx.filter_jit
@exact_matmuls
def _integrate(
    model,
    objective,
    field: AbstractField,
    ts,
    t0,
    t1,
    block_size,
    ends_only,
    targets,
    reduce,
    *,
    clock,
    **options,
):
    to_solver = jnp.log1p if clock == "log" else (lambda t: t)
    from_solver = jnp.expm1 if clock == "log" else (lambda s: s)

    def vector_field(s, y, args):
        model, objective, constants = args[:3]
        dy = field(y, model, objective, constants)
        if clock == "log":
            return jax.tree.map(lambda d: jnp.exp(s) * d, dy)  # dy/dtau = (1 + t) dy/dt
        return dy

    s0, s1 = to_solver(t0), to_solver(t1)
    save_at = jnp.clip(to_solver(ts), s0, s1)  # log1p(expm1(x)) can exceed x by one ulp
    controller = stiff.controller(
        options["solver"], options["rtol"], options["atol"], None if ends_only else save_at
    )

    def begin(m, o):
        levels = None if targets is None else targets.levels(m, o)
        return field.initial(m, o), field.constants(m, o), levels

    y0, constants, levels = over_inits(begin, model, objective, block_size=block_size)
    crossings = None
    if targets is not None and batches(options["solver"], options["adjoint"], controller):

        def crossings(s, y, args):  # the targets' gaps at one state of one init
            model, objective, constants, levels = args
            weights, loss = field.observe(y, model, objective, constants)
            return targets.from_observed(weights, loss, levels)

    # the targets' levels ride along only when there are targets (an empty leaf would
    # trip diffrax's backsolve adjoint, which rebuilds the args)
    args = (model, objective, constants) + ((levels,) if targets is not None else ())

    def finish(ys, status, args):  # one init's saved states -> what the trajectory keeps
        model, objective, constants = args[:3]
        path, a = field.value_path(ys, model, objective)
        # the field's own observation (the reduced field's needs no V)
        weights, loss = jax.vmap(lambda y: field.observe(y, model, objective, constants))(ys)
        finite = all_finite((path, a, weights, loss))
        status = jnp.where((status == codes.OK) & ~finite, codes.NONFINITE, status)
        if reduced:
            return reduce(path, a, weights, loss, status == codes.OK, objective), status
        return (path, a, weights, loss), status

    reduced = reduce is not None and crossings is not None

    solution = integrate(
        vector_field,
        y0,
        args,
        (batch_axes(model), batch_axes(objective), 0) + ((0,) if targets is not None else ()),
        t0=s0,
        t1=s1,
        ts=save_at,
        ends_only=ends_only,
        block_size=block_size,
        stepsize_controller=controller,
        crossings=crossings,
        finish=finish,
        **options,
    )
    status = solution.status
    ok = status == codes.OK
    if reduced:
        traj = dict(solution.ys, ok=ok, status=status, steps=solution.steps)
    else:
        V, a, weights, loss = solution.ys
        traj = Trajectory(
            ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=solution.steps
        )
    crossed = solution.crossed
    if crossed is not None:  # solver clock -> flow time (a target reached at the start: t0 exactly)
        crossed = jnp.where(crossed == s0, t0, from_solver(crossed))
        crossed = jnp.where(ok[:, None], crossed, jnp.nan)
    return traj, crossed
