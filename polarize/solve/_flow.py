"""The exact gradient flow dtheta/dt = -grad L(theta), and the modified flow of GD, by diffrax.

Polarization lives on a logarithmic clock (1 - max s ~ C / (log t)^2 under the
logistic loss), so by default the ODE is integrated in tau = log(1 + t):
dtheta/dtau = (1 + t) dtheta/dt. Horizons such as t = 1e30 then take a few hundred
steps and nothing overflows.

`flow` and `modified_flow` are two thin drivers over one solve: their keyword arguments
become a `SolveOptions`, the common preamble (`fields.prepare`) chooses the vector field
(`polarize.fields`), the options are resolved for it once (`SolveOptions.resolved`), and
`engine.integrate` runs it in fixed blocks of initializations.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ..core import status as codes
from ..core._batching import (
    Precision,
    batch_axes,
    ensemble_size,
    exact_matmuls,
    float_dtype,
    in_threads,
    over_inits,
)
from ..core._models import AbstractModel, params, with_params
from ..core._objectives import AbstractObjective
from ..core._refuse import refuse_if, shown
from ..core._trajectory import Trajectory, all_finite, over_saved
from ..core.fields import AbstractField, Modified, Path, prepare
from . import _stiff as stiff
from ._devices import release_programs_if_crowded
from ._engine import batches, integrate
from ._options import Clock, SolveOptions


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
            method of `polarize.solve._stiff` for `Square` and `CrossEntropy` at long horizons
            (stiff once the loss converges), Tsit5 otherwise.
        rtol, atol: tolerances of the PID step-size controller.
        max_steps: per-initialization cap on solver steps.
        clock: "log" integrates in tau = log(1 + t), "linear" in t itself; default
            "linear" for `Square` and `CrossEntropy`, else "log".
        path: vector-field form, see `polarize.fields` ("auto" picks the cheapest).
        adjoint: diffrax adjoint for gradients through the solve (default: checkpointed).
        precision: "float32" or "float64" casts model and objective first; None (default)
            keeps the model's dtype (an ensemble built in float32 flows in float32).
        block_size: initializations per vmapped block (default 128); results are
            bit-identical for a fixed block size whatever the batch size.

    Returns:
        A `Trajectory`. Every initialization gets a `polarize.status` code; a failed
        one (ok=False) leaves the rest of the batch unaffected.
    """
    options = SolveOptions(
        t1=t1,
        t0=t0,
        n_save=n_save,
        ts=ts,
        solver=solver,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        clock=clock,
        path=path,
        adjoint=adjoint,
        precision=precision,
        block_size=block_size,
    )
    return solve_flow(model, objective, options)[0]


def solve_flow(model, objective, options: SolveOptions, *, reduce=None):
    """The flow of `options`: (trajectory, crossing times of `options.targets` or None).

    The times are None where there are no targets, or where the engine does not run its
    batched loop (implicit and Rosenbrock solvers: see `polarize.solve._hitting`).

    `reduce(path, a, weights, loss, ok, objective)`, given with targets, maps ONE
    initialization's trajectory (times first) to the numbers kept of it. Where the
    crossings come from the batched loop, it runs on each block as soon as it is solved
    and the trajectories are never stored: the result is then a dict of its outputs
    with `ok`, `status` and `steps`, in place of the `Trajectory`.
    """
    model, objective, field = prepare(model, objective, path=options.path, precision=options.precision)
    return _solve(model, objective, field, options.resolved(model, objective, field), reduce)


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
    flow. Every other argument is as for `flow` (with tighter default tolerances, and
    Tsit5 whatever the objective); the field is `fields.Modified(lr, base)` on the `path`
    form, exact in reduced coordinates too because plain GD is the same iteration there.
    """
    bad = lambda lr, xp: ~(xp.isfinite(lr) & (xp.asarray(lr) >= 0))
    lr = refuse_if(lr, bad, f"`lr` must be a finite number >= 0; got {shown(lr)}")
    options = SolveOptions(
        t1=t1,
        t0=t0,
        n_save=n_save,
        ts=ts,
        solver=diffrax.Tsit5() if solver is None else solver,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        clock=clock,
        path=path,
        adjoint=adjoint,
        precision=precision,
        block_size=block_size,
    )
    model, objective, base = prepare(model, objective, path=path, precision=precision)
    field = Modified(jnp.asarray(lr, float_dtype(model)), base)
    return _solve(model, objective, field, options.resolved(model, objective, field), None)[0]


def _controller(options: SolveOptions, save_at):
    return stiff.controller(
        options.solver, options.rtol, options.atol, None if options.ends_only else save_at
    )


def decided(model, objective, options: SolveOptions) -> SolveOptions:
    """`options` resolved as `solve_flow` resolves them for these concrete arrays: where
    `options` leaves the solver and clock to the default, the stiff objectives' choice
    reads the objective's curvature, which a trace of a program taking the objective as an
    argument cannot (it would take the stiff method at any horizon)."""
    model, objective, field = prepare(model, objective, path=options.path, precision=options.precision)
    return options.resolved(model, objective, field)


def crosses_in_loop(options: SolveOptions) -> bool:
    """Whether `solve_flow` of resolved `options` (`decided`) locates its targets'
    crossings in the engine's batched loop (and then reduces each block there, given a
    `reduce`): explicit Runge-Kutta solvers under the engine's own step control."""
    controller = _controller(options, None if options.ends_only else options.ts)
    return options.targets is not None and batches(options.solver, options.adjoint, controller)


def _solve(model, objective, field, options: SolveOptions, reduce):
    """One integration of resolved `options`: (trajectory, crossing times or None)."""
    release_programs_if_crowded(model, objective, options)
    # `prepare` has applied `path` and `precision`: the field and the arrays' dtypes carry
    # them. Left in the static options, one problem asked for in two ways (path="auto" or
    # the form it picks, a float32 model or precision="float32") compiled twice.
    options = dataclasses.replace(options, path="auto", precision=None)
    single = ensemble_size(model, objective) is None
    if single:  # one initialization: a batch of one, in a block of one
        model = with_params(model, [p[None] for p in params(model)])
        options = dataclasses.replace(options, block_size=1)
    joined = None
    if options.targets is None:  # (targets may hold per-init levels: those flows run whole)
        shared = lambda out: out[0].ts  # every other leaf carries the inits axis
        joined = in_threads(
            _integrate, model, objective, field, options, reduce, _block=options.block_size, _shared=shared
        )
    traj, crossed = _integrate(model, objective, field, options, reduce) if joined is None else joined
    if single:
        shared = traj.ts if isinstance(traj, Trajectory) else None
        traj = jax.tree.map(lambda x: x if x is shared else x[0], traj)
        crossed = None if crossed is None else crossed[0]
    return traj, crossed


@eqx.filter_jit
@exact_matmuls
def _integrate(model, objective, field: AbstractField, options: SolveOptions, reduce):
    log = options.clock == "log"
    to_solver = jnp.log1p if log else (lambda t: t)
    from_solver = jnp.expm1 if log else (lambda s: s)
    targets = options.targets

    def vector_field(s, y, args):
        model, objective, constants = args[:3]
        dy = field(y, model, objective, constants)
        if log:
            return jax.tree.map(lambda d: jnp.exp(s) * d, dy)  # dy/dtau = (1 + t) dy/dt
        return dy

    s0, s1 = to_solver(options.t0), to_solver(options.t1)
    save_at = jnp.clip(to_solver(options.ts), s0, s1)  # log1p(expm1(x)) can exceed x by one ulp
    controller = _controller(options, save_at)

    def begin(m, o):
        levels = None if targets is None else targets.levels(m, o)
        return field.initial(m, o), field.constants(m, o), levels

    y0, constants, levels = over_inits(begin, model, objective, block_size=options.block_size)
    crossings = None
    if targets is not None and batches(options.solver, options.adjoint, controller):  # see `crosses_in_loop`

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
        # the field's own observation (the reduced field's needs no V), a few saved
        # states at a time where the data is large
        weights, loss = over_saved(lambda y: field.observe(y, model, objective, constants), ys, objective)
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
        options=options,
        stepsize_controller=controller,
        crossings=crossings,
        finish=finish,
    )
    status = solution.status
    ok = status == codes.OK
    if reduced:
        traj = dict(solution.ys, ok=ok, status=status, steps=solution.steps)
    else:
        V, a, weights, loss = solution.ys
        traj = Trajectory(
            ts=options.ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=solution.steps
        )
    crossed = solution.crossed
    if crossed is not None:  # solver clock -> flow time (a target reached at the start: t0 exactly)
        crossed = jnp.where(crossed == s0, options.t0, from_solver(crossed))
        crossed = jnp.where(ok[:, None], crossed, jnp.nan)
    return traj, crossed
