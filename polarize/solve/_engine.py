"""The one integration engine behind `flow` and `modified_flow`: many initial states, one ODE.

`integrate(field, y0, args, ...)` solves dy/ds = field(s, y, args) for every
initialization, with y0 and the per-initialization part of `args` carrying a leading
inits axis (`args_axes` says which leaves, as `jax.vmap`'s in_axes). Times are in the
solver's clock (the caller maps physical time to it). The result holds the states at
the save times, a status code per initialization (`polarize.status`) and the number
of accepted steps.

`method="batched"` (the default) is one stepping loop per fixed block of
initializations around diffrax's own numerics: the explicit solver's Butcher tableau
(stages written out, or in a loop for small states on a CPU: `_rk_step`),
`PIDController.adapt_step_size`, and the solver's dense interpolation for the saved
times, each initialization with its own adaptive steps. The block keeps the inits axis
last (struct of arrays); each accepted step interpolates the next few save times at once
and writes them as one contiguous window per init (the ones it crossed are kept, the
rest overwritten later), and finished inits are frozen. A block's loop runs until its
slowest initialization has finished; on a CPU, a block of large states (inits axis first)
is stepped as sub-blocks of `SUB_BLOCK` inits one after another (`_sub_block`), each
loop ending with its own slowest init, and finished as one block.
A `finish` function turns each block's saved states into what the caller keeps while
they are still in cache, so the full (inits, times, state) array need never exist.
The loop takes the same steps as diffeqsolve (same tableau, controller and first step),
so results agree to rounding. The loop is `equinox.internal.while_loop`:
checkpointed (reverse-mode differentiable, as diffrax's own) by default, a plain
`lax` loop for `diffrax.ForwardMode`.

`method="diffeqsolve"` is the reference: `jax.vmap(diffrax.diffeqsolve)` inside the
same fixed blocks. Implicit solvers and `diffrax.BacksolveAdjoint` always use it.

Either way every initialization runs the same compiled block program, so results are
bit-identical whatever the batch size.
"""

from collections.abc import Callable
from typing import Literal

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.flatten_util
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from ..core import status as codes
from ..core._batching import block_map, blockwise, partition_inits
from ..core._errors import check_choice
from ._options import SolveOptions
from ._roots import chandrupatla

Method = Literal["batched", "diffeqsolve"]
METHODS = ("batched", "diffeqsolve")


class Solution(eqx.Module):
    """States at the save times, per initialization: ys leaves are (inits, times, ...)
    (or, where `integrate` was given `finish`, its outputs with the inits axis first).

    `crossed` (when `integrate` was given `crossings`): per initialization and target,
    the solver time at which that target's gap first reached 0 (t0 when it is >= 0 at
    the start, inf when never by t1), or None.
    """

    ys: PyTree[Float[Array, "inits times ..."]]
    status: Int[Array, " inits"]
    steps: Int[Array, " inits"]
    crossed: Float[Array, "inits targets"] | None = None


def batches(
    solver: diffrax.AbstractSolver,
    adjoint: diffrax.AbstractAdjoint | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    method: Method = "batched",
) -> bool:
    """Whether `integrate` runs these options in its batched stepping loop.

    It does for explicit Runge-Kutta solvers under the engine's own PID control; implicit
    solvers, custom controllers and the backsolve adjoint go through `diffeqsolve`.
    """
    return (
        method == "batched"
        and stepsize_controller is None
        and _is_explicit_rk(solver)
        and not isinstance(adjoint, diffrax.BacksolveAdjoint)
    )


def status_of(result) -> Int[Array, ""]:
    """The `polarize.status` code of a diffrax result (without diffrax's private values)."""
    return jnp.select(
        [
            result == diffrax.RESULTS.successful,
            result == diffrax.RESULTS.max_steps_reached,
        ],
        [jnp.int32(codes.OK), jnp.int32(codes.MAX_STEPS)],
        jnp.int32(codes.SOLVER_FAILED),
    )


def integrate(
    field: Callable,
    y0: PyTree,
    args: PyTree,
    args_axes: PyTree,
    *,
    t0: Float[Array, ""],
    t1: Float[Array, ""],
    ts: Float[Array, " times"],
    options: SolveOptions,
    method: Method = "batched",
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    crossings: Callable | None = None,
    finish: Callable | None = None,
) -> Solution:
    """Solve dy/ds = field(s, y, args) from t0 to t1 for every initialization.

    Args:
        field: the vector field of ONE initialization, in solver time.
        y0: initial states, every leaf with a leading inits axis.
        args: the field's arguments; `args_axes` (a pytree prefix of `args`, 0 or None,
            as `jax.vmap`'s in_axes) marks the leaves batched over inits.
        t0, t1, ts: start, end and save times in solver time, shared by all inits
            (ts within [t0, t1]; ignored when `options.ends_only`, which saves t0 and t1).
        options: resolved `SolveOptions`; the engine reads its `solver`, `rtol`, `atol`,
            `max_steps` and `adjoint` (as for `diffrax.diffeqsolve` with a PID step-size
            controller), `block_size` (part of a result's bit-identity) and `ends_only`.
        method: "batched" (default; explicit Runge-Kutta solvers) or "diffeqsolve"
            (reference; used for implicit solvers and the backsolve adjoint anyway).

        crossings: optional gaps(t, y, args) -> (targets,) of ONE initialization, a
            target being reached where its gap is >= 0. The loop then records the
            accepted step in which each gap first reached 0, and after the loop the
            crossing time is located on that step's dense output (Chandrupatla's
            method, to rounding), so every accepted step is checked, not only saved times.
            Batched method only (`batches`); the times are in `Solution.crossed`.
        finish: optional finish(ys, status, args) -> (outputs, status) of ONE
            initialization (ys leaves with the times first), applied to each block as
            soon as it is solved, while its saved states are still in cache; the solution
            then holds `outputs` in place of the saved states (`Solution.ys`), and the
            status it returns.

    Status per initialization (`polarize.status`): OK; MAX_STEPS when `max_steps`
    steps did not reach t1; SOLVER_FAILED when the controller fails or the step size
    collapses to zero; NONFINITE (batched) when the field is NaN/Inf at an accepted
    state, which stops that initialization at once.
    """
    check_choice("method", method, METHODS)
    solver, rtol, atol, max_steps = options.solver, options.rtol, options.atol, options.max_steps
    adjoint, block_size, ends_only = options.adjoint, options.block_size, options.ends_only
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
    # The batched loop drives explicit Runge-Kutta tableaus; implicit solvers (Newton
    # iterations per stage) and the backsolve adjoint (its own adjoint ODE) go through
    # diffeqsolve.
    custom = stepsize_controller is not None
    if batches(solver, adjoint, stepsize_controller, method):
        kind = "lax" if isinstance(adjoint, diffrax.ForwardMode) else "checkpointed"
        # One flat state vector per init: every Runge-Kutta combination, error norm and
        # saved-time interpolation is then one kernel over the block instead of one per
        # leaf (XLA on CPU runs a step as ~150 small kernels; their count is the cost).
        flat, unflat = _flattened(y0, field, crossings)
        y0, field, crossings = flat if flat is not None else (y0, field, crossings)
        ys, status, steps, crossed = block_map(
            _batched_solver(
                field,
                args,
                args_axes,
                t0=t0,
                t1=t1,
                ts=ts,
                options=options,
                kind=kind,
                state_size=sum(x[0].size for x in jax.tree.leaves(y0)),
                crossings=crossings,
                unflat=unflat,
                finish=finish,
            ),
            (y0, partition_inits(args, args_axes)[0]),
            block_size=block_size,
        )
        return Solution(ys=ys, status=status, steps=steps, crossed=crossed)
    if crossings is not None:
        raise ValueError("`crossings` needs the batched method (see `engine.batches`)")
    saveat = diffrax.SaveAt(t0=True, t1=True) if ends_only else diffrax.SaveAt(ts=ts)
    batched, shared = partition_inits(args, args_axes)

    def solve_one(y0, batched_args):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            solver,
            t0=t0,
            t1=t1,
            dt0=None,
            y0=y0,
            args=eqx.combine(batched_args, shared),
            saveat=saveat,
            stepsize_controller=stepsize_controller
            if custom
            else diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=max_steps,
            adjoint=adjoint,
            throw=False,
        )
        status = status_of(sol.result)
        ys = sol.ys
        if finish is not None:
            ys, status = finish(ys, status, eqx.combine(batched_args, shared))
        return ys, status, sol.stats["num_accepted_steps"]

    ys, status, steps = blockwise(lambda x: solve_one(*x), (y0, batched), block_size=block_size)
    return Solution(ys=ys, status=status, steps=steps)


#: Flatten the state of each initialization into one vector in the batched loop.
FLATTEN = True


def _flattened(y0, field, crossings=None):
    """((flat y0, field and crossings on flat states), unflatten of a block's states), or (None, identity).

    Only for states whose leaves share one dtype (raveling would promote the others).
    The per-init structure is that of y0's first initialization.
    """
    leaves = jax.tree.leaves(y0)
    if not FLATTEN or len(leaves) < 2 or len({x.dtype for x in leaves}) > 1:
        return None, lambda ys: ys
    _, unravel = jax.flatten_util.ravel_pytree(jax.tree.map(lambda x: x[0], y0))
    ravel = lambda y: jax.flatten_util.ravel_pytree(y)[0]

    def flat_field(t, y, args):
        return ravel(field(t, unravel(y), args))

    def unflat(ys):  # (inits, times, size) -> the state's pytree with (inits, times) in front
        return jax.vmap(jax.vmap(unravel))(ys)

    flat_crossings = None if crossings is None else (lambda t, y, args: crossings(t, unravel(y), args))
    return (jax.vmap(ravel)(y0), flat_field, flat_crossings), unflat


#: Saved times interpolated and written at once per accepted step (see `_SaveTimes`).
SAVE_SLOTS = 4


class _State(eqx.Module):
    """The stepping loop's carry for one block; per-init leaves carry the inits axis last."""

    tprev: Array
    tnext: Array
    y: PyTree
    solver_state: PyTree
    controller_state: PyTree
    status: Array
    steps: Array
    accepted: Array
    save_index: Array
    saved: PyTree  # (inits, n_save + SAVE_SLOTS, ...) per leaf, written in place
    # crossings (empty tuples without): per target and init, whether reached, and the
    # accepted step [lo_t, hi_t] in which it first was, with that step's dense output
    found: Array | tuple = ()
    lo_t: Array | tuple = ()
    hi_t: Array | tuple = ()
    lo_dense: PyTree = ()


#: States of at most this many numbers per init are stepped with the inits axis last
#: (struct of arrays: reductions over tokens become elementwise across inits); larger
#: ones with it first, where XLA's batched matrix products are faster (measured).
SOA_MAX_STATE = 32

#: On a CPU, blocks of states of at least `SUB_BLOCK_MIN_STATE` numbers per init are
#: stepped as sub-blocks of `SUB_BLOCK` inits (see `_sub_block`).
SUB_BLOCK = 16
SUB_BLOCK_MIN_STATE = 256


def _sub_block(axis: int, state_size: int, size: int) -> int | None:
    """How many inits of a block of `size` one stepping loop steps at a time: None for
    the whole block, else `SUB_BLOCK` (the sub-blocks' loops run one after another).

    A block's loop runs until its slowest init has finished, every init computed in
    every pass (frozen ones too), so a block of many inits whose step counts spread pays
    for the slowest one many times over. Measured on a CPU (square loss, T = d = 20,
    inits first, 256 inits, kappa 2 and 10): 0.92-1.01 s as blocks of 128, 0.77-0.85 s
    in sub-blocks of 16; where the step counts do not spread, sub-blocks cost up to 4%
    (cross-entropy, T = d = 30). The numbers are the same bit for bit (there, and at
    T = d = 16 and 30, square and cross-entropy): each init's steps do not depend on the
    others, and a block's `finish` still runs on the whole block. Smaller sub-blocks, or
    states below `SUB_BLOCK_MIN_STATE` (sub-blocks of 32 at T = d = 8), were faster still
    but changed the last bits: XLA computes the products of smaller batches another way.
    Only on a CPU, where a block's loop runs on one core; on a GPU a block is one wide
    kernel per operation, and its sub-blocks would run one after another.
    """
    if axis != 0 or state_size < SUB_BLOCK_MIN_STATE or jax.default_backend() != "cpu":
        return None
    return SUB_BLOCK if size > SUB_BLOCK and size % SUB_BLOCK == 0 else None


def _lastaxis(fn, axis=-1):
    """`fn` of one initialization, vmapped over the block's inits axis."""
    return jax.vmap(fn, in_axes=axis, out_axes=axis)


def _pick(mask, a, b, axis=-1):
    """where(mask, a, b) with the (inits,) mask on the inits axis of a and b."""

    def one(x, y):
        m = mask if axis == -1 else mask.reshape(mask.shape + (1,) * (x.ndim - 1))
        return jnp.where(jnp.broadcast_to(m, x.shape), x, y)

    return jax.tree.map(one, a, b)


def _batched_solver(
    field,
    args,
    args_axes,
    *,
    t0,
    t1,
    ts,
    options: SolveOptions,
    kind,
    state_size,
    crossings=None,
    unflat=lambda y: y,
    finish=None,
):
    """The stepping loop for one block of initializations, around diffrax's own numerics.

    Every initialization takes its own adaptive steps, exactly as `diffeqsolve` with a
    PID controller would: the solver's `step`, the controller's `adapt_step_size` and
    the solver's dense interpolation, vmapped over the block. The block's state keeps
    the inits axis last (struct of arrays), so reductions over tokens and dims become
    elementwise operations across inits. An initialization that has finished is
    frozen; the loop stops when every one has. Saved times are interpolated inside the
    loop, SAVE_SLOTS at a time (`_SaveTimes`), or only the ends kept (`_SaveEnds`). With
    `crossings`, each accepted state's gaps are checked, and the step where a gap first
    reached 0 is kept for locating the crossing after the loop (`_Crossings`).

    Returns solve_block((y0, batched args)) -> (saved or finished, status, accepted
    steps, crossed or None) for one block, its leaves with the inits axis first.
    """
    _, shared = partition_inits(args, args_axes)
    solver = options.solver
    terms = diffrax.ODETerm(field)
    controller = diffrax.PIDController(rtol=options.rtol, atol=options.atol)
    error_order = solver.error_order(terms)
    # within 100 ulps of t1 a step is rounded to end there, as diffrax does (its 100
    # `prevbefore` calls, in a loop: unrolled they were ~1,700 instructions of the program)
    t1_floor = jax.lax.fori_loop(0, 100, lambda _, t: eqxi.prevbefore(t), jnp.asarray(t1))
    problem = _Problem(
        field=field,
        shared=shared,
        terms=terms,
        solver=solver,
        controller=controller,
        t0=t0,
        t1=t1,
        t1_floor=t1_floor,
        error_order=error_order,
        max_steps=options.max_steps,
        kind=kind,
        axis=-1 if state_size <= SOA_MAX_STATE else 0,
    )
    saves = _SaveEnds(problem) if options.ends_only else _SaveTimes(problem, ts)
    hits = None if crossings is None else _Crossings(problem, crossings)

    def solve_block(block):
        size = jax.tree.leaves(block[0])[0].shape[0]
        step = lambda block: _step_block(problem, saves, hits, block)
        sub = _sub_block(problem.axis, state_size, size)
        if sub is None:
            saved, status, accepted, crossed = step(block)
        else:  # the sub-blocks' loops one after another, their results joined
            split = lambda x: x.reshape((size // sub, sub) + x.shape[1:])
            join = lambda x: x.reshape((size,) + x.shape[2:])
            stepped = jax.lax.map(step, jax.tree.map(split, block))
            saved, status, accepted, crossed = jax.tree.map(join, stepped)
        saved = unflat(saved)
        if finish is not None:
            saved, status = _finish(problem, finish, saved, status, block[1])
        return saved, status, accepted, crossed

    return solve_block


class _Problem(eqx.Module):
    """What every part of a block's stepping loop reads: dy/ds = field(s, y, args) on
    [t0, t1], the explicit Runge-Kutta solver and its PID controller, and the layout.

    `start`, `step` and `interpolate` are of ONE initialization (the loop vmaps them).
    """

    field: Callable
    shared: PyTree  # the part of the field's args shared by every init
    terms: diffrax.ODETerm
    solver: diffrax.AbstractSolver
    controller: diffrax.PIDController
    t0: Float[Array, ""]
    t1: Float[Array, ""]
    t1_floor: Float[Array, ""]  # a step ending past it ends at t1 instead
    error_order: int = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)  # of `eqxi.while_loop`: "checkpointed" or "lax"
    axis: int = eqx.field(static=True)  # the inits axis of a block's leaves: -1 or 0

    def args(self, batched):
        """The field's args of one init, from its batched part."""
        return eqx.combine(batched, self.shared)

    @property
    def rolled(self) -> bool:
        """Whether a step's stages run as a loop (`_rk_step`): for states stepped with the
        inits axis last, on a CPU. It was measured there only; on a GPU, XLA may read the
        index of every loop iteration and switch back to the host, so the written-out step
        stays."""
        return self.axis == -1 and jax.default_backend() == "cpu"

    def active(self, s: _State):
        """Per init (of the block): not yet at t1, not failed, with steps left."""
        return (s.tprev < self.t1) & (s.status == codes.OK) & (s.steps < self.max_steps)

    def start(self, y0, batched):
        """(end of the first step, controller state, f(t0, y0)) of one init."""
        args = self.args(batched)
        # diffeqsolve(dt0=None) hands the controller a wrapped term, for which the PID
        # initial-step rule returns 0.01: start there too, so both methods step alike.
        dt0 = jnp.asarray(0.01, jnp.result_type(self.t0, self.t1))
        tnext, controller_state = self.controller.init(
            self.terms, self.t0, self.t1, y0, dt0, args, self.solver.func, self.error_order
        )
        tnext = jnp.minimum(tnext, self.t1)
        # The solver state is f(tprev, y): the tableau's first stage is the last one's.
        return tnext, jax.tree.map(jnp.asarray, controller_state), self.field(self.t0, y0, args)

    def step(self, tprev, tnext, y, batched, solver_state, controller_state):
        """One init's Runge-Kutta step over [tprev, tnext], accepted or rejected by the PID rule.

        The controller accepts where the error estimate's scaled RMS norm is <= 1 and
        proposes the next interval from it. Returns (keep, next tprev, next tnext, y and
        f(t, y) after the step (unchanged where rejected), controller state, the step's
        dense information, whether the controller failed).
        """
        args = self.args(batched)
        y1, y_error, dense, solver_state1 = _rk_step(
            self.solver.tableau, self.field, tprev, tnext, y, args, solver_state, rolled=self.rolled
        )
        y_error = jax.tree.map(lambda x: jnp.where(jnp.isnan(x), jnp.inf, x), y_error)
        keep, tprev1, tnext1, _, controller_state1, controller_result = self.controller.adapt_step_size(
            tprev, tnext, y, y1, args, y_error, self.error_order, controller_state
        )
        t1 = self.t1
        tprev1 = jnp.minimum(tprev1, t1)
        clip = tnext1 > self.t1_floor
        tnext1 = jnp.where(clip, jnp.where(keep, t1, tprev1 + 0.5 * (t1 - tprev1)), tnext1)
        failed = controller_result != diffrax.RESULTS.successful
        y1 = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1, y)
        solver_state1 = jax.tree.map(lambda a, b: jnp.where(keep, a, b), solver_state1, solver_state)
        controller_state1 = jax.tree.map(jnp.asarray, controller_state1)
        return keep, tprev1, tnext1, y1, solver_state1, controller_state1, dense, failed

    def interpolate(self, tprev, tnext, dense, t):
        """One init's y(t) on the step [tprev, tnext], by the solver's dense output.

        y(t) = w0 y0 + w1 y1 + sum_j w_j k_j, weights from the solver's interpolation.
        """
        # diffrax's dense output is linear in the step's dense information (y0, y1 and
        # the stage increments k), the same polynomial weights for every component of
        # the state: take the weights from the solver's own interpolation on a state of
        # one number, then sum the stages elementwise (no stacked (stages, state) array
        # and no matrix-vector product, which cost XLA a transpose and a copy per step).
        y0, y1, ks = dense["y0"], dense["y1"], dense["k"]
        zero = jnp.zeros((), tprev.dtype)
        unit = dict(y0=zero, y1=zero, k=jnp.zeros(len(ks), tprev.dtype))
        at = lambda d: self.solver.interpolation_cls(t0=tprev, t1=tnext, **d).evaluate(t)
        w = jax.grad(at)(unit)

        def leaf(y0, y1, *k):
            out = w["y0"].astype(y0.dtype) * y0 + w["y1"].astype(y0.dtype) * y1
            for i, k_i in enumerate(k):
                out = out + w["k"][i].astype(y0.dtype) * k_i
            return out

        return jax.tree.map(leaf, y0, y1, *ks)


def _step_block(problem: _Problem, saves, crossings, block):
    """One block's stepping: its states to the loop's layout, the stepping loop, then
    (saved states, status, accepted steps, crossing times or None), inits first again.

    `saves` is `_SaveTimes` or `_SaveEnds`, `crossings` a `_Crossings` or None.
    """
    p = problem
    y0, batched = block
    size = jax.tree.leaves(y0)[0].shape[0]
    to_last = lambda tree: jax.tree.map(lambda x: jnp.moveaxis(x, 0, p.axis), tree)
    y0, batched = to_last(y0), to_last(batched)
    tnext, controller_state, solver_state = _lastaxis(p.start, p.axis)(y0, batched)
    like = lambda x: jnp.broadcast_to(x, (size,))
    zeros = jnp.zeros(size, jnp.int32)
    saved = saves.start(y0, size, zeros)
    tprev = like(jnp.asarray(p.t0, tnext.dtype))
    hits = {} if crossings is None else crossings.start(tprev, y0, batched)
    state = _State(
        tprev=tprev,
        tnext=tnext,
        y=y0,
        solver_state=solver_state,
        controller_state=controller_state,
        status=zeros,
        steps=zeros,
        accepted=zeros,
        save_index=zeros,
        saved=saved,
        **hits,
    )

    def body(s):
        return _advance(p, saves, crossings, batched, s)

    s = eqxi.while_loop(lambda s: jnp.any(p.active(s)), body, state, max_steps=p.max_steps, kind=p.kind)
    status = jnp.where((s.status == codes.OK) & (s.tprev < p.t1), codes.MAX_STEPS, s.status)
    crossed = None if crossings is None else crossings.locate(s, batched)
    return saves.end(s, zeros), status, s.accepted, crossed


def _advance(problem: _Problem, saves, crossings, batched, s: _State) -> _State:
    """One pass of the stepping loop: every active init of the block tries one step.

    An accepted step moves the init on and writes the saved times it crossed; a rejected
    one retries with the controller's smaller interval. Inits that finished, failed, or
    whose f(t, y) is no longer finite are frozen (statuses SOLVER_FAILED, NONFINITE).
    """
    p = problem
    # f(tprev, y) is NaN or Inf: no step can succeed, so stop this init at once
    # (diffeqsolve would shrink the step until max_steps).
    finite = _lastaxis(
        lambda f: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(f)])), p.axis
    )
    broken = p.active(s) & ~finite(s.solver_state)
    going = p.active(s) & ~broken
    keep, tprev, tnext, y, solver_state, controller_state, dense, failed = _lastaxis(p.step, p.axis)(
        s.tprev, s.tnext, s.y, batched, s.solver_state, s.controller_state
    )
    keep = keep & going
    stuck = going & ~keep & ~(tnext > tprev)  # the step size collapsed to zero
    save_index, saved = saves.after_step(s, keep, dense)
    status = jnp.where(going & failed, codes.SOLVER_FAILED, s.status)
    status = jnp.where(stuck, codes.SOLVER_FAILED, status)
    status = jnp.where(broken, codes.NONFINITE, status)
    hits = {} if crossings is None else crossings.after_step(s, keep, y, dense, batched)
    return _State(
        tprev=jnp.where(going, tprev, s.tprev),
        tnext=jnp.where(going, tnext, s.tnext),
        y=_pick(going, y, s.y, p.axis),
        solver_state=_pick(going, solver_state, s.solver_state, p.axis),
        controller_state=_pick(going, controller_state, s.controller_state, p.axis),
        status=status,
        steps=s.steps + going,
        accepted=s.accepted + keep,
        save_index=save_index,
        saved=saved,
        **hits,
    )


def _saved_buffer(y0, size, slots, axis):
    """(inits, slots, ...) per leaf of the block's states y0 (inits on `axis`), all inf."""
    return jax.tree.map(
        lambda x: jnp.full((size, slots) + (x.shape[:-1] if axis == -1 else x.shape[1:]), jnp.inf, x.dtype),
        y0,
    )


def _write(saved, index, y, axis):
    """`saved` with rows index, index + 1, ... of each init overwritten by y's k rows.

    y leaves are (k, ..., inits) or (k, inits, ...) (inits on `axis` after the k); one
    scatter of contiguous rows per init.
    """
    rows_first = lambda x: jnp.moveaxis(x, (0, axis), (1, 0)) if axis == -1 else jnp.moveaxis(x, 0, 1)
    put = jax.vmap(lambda buf, x, i: jax.lax.dynamic_update_slice_in_dim(buf, x, i, axis=0))
    return jax.tree.map(lambda buf, x: put(buf, rows_first(x), index), saved, y)


def _one(y):
    """The block's states y as one row (k = 1) for `_write`."""
    return jax.tree.map(lambda x: x[None], y)


class _SaveEnds(eqx.Module):
    """Saving y(t0) and y(t1) only (`ends_only`): slot 0 before the loop, slot 1 after it."""

    problem: _Problem

    def start(self, y0, size, zeros):
        """The (inits, 2, ...) buffer with y0 in slot 0 (`zeros`: the (inits,) index 0)."""
        saved = _saved_buffer(y0, size, 2, self.problem.axis)
        return _write(saved, zeros, _one(y0), self.problem.axis)

    def after_step(self, s: _State, keep, dense):
        """(save index, saved): nothing to save inside the loop."""
        return s.save_index, s.saved

    def end(self, s: _State, zeros):
        """The buffer with the last state in slot 1."""
        return _write(s.saved, zeros + 1, _one(s.y), self.problem.axis)


class _SaveTimes(eqx.Module):
    """Saving y at the times ts, interpolated on each accepted step's dense output.

    Saved states are (inits, slots, ...) per leaf, SAVE_SLOTS slots of padding after the
    n_save times. Each accepted step writes a window of SAVE_SLOTS consecutive slots per
    init from its first unsaved one (one scatter of contiguous rows): the slots the step
    crossed get their values, the later ones are overwritten by the steps that cross
    them. Slots never reached (a failed init) are set to inf after the loop.
    """

    problem: _Problem
    ts: Float[Array, " times"]

    def start(self, y0, size, zeros):
        """The empty (inits, n_save + SAVE_SLOTS, ...) buffer."""
        return _saved_buffer(y0, size, self.ts.shape[0] + SAVE_SLOTS, self.problem.axis)

    def after_step(self, s: _State, keep, dense):
        """(save index, saved) after the step from s.tprev to s.tnext, kept where `keep`."""
        p, ts = self.problem, self.ts
        n_save = ts.shape[0]
        # y at (k, inits) times
        interpolate_k = jax.vmap(_lastaxis(p.interpolate, p.axis), in_axes=(None, None, None, 0))
        # The next SAVE_SLOTS save times are interpolated at once for every init and
        # written as one window, again while any init of the block still has a save time
        # due (a step that crossed more than SAVE_SLOTS of them); a step where none is due
        # skips it (saving t0 and t1 of explicit `ts`: 23.3 -> 20.7 us per toy init,
        # ends-only 15.7).
        offsets = jnp.arange(SAVE_SLOTS)[:, None]

        def due(index):
            return keep & (index < n_save) & (ts[jnp.minimum(index, n_save - 1)] <= s.tnext)

        def save(c):
            index, saved = c
            slots = index[None] + offsets
            t = ts[jnp.minimum(slots, n_save - 1)]
            crossed = keep[None] & (slots < n_save) & (t <= s.tnext[None])
            y_t = interpolate_k(s.tprev, s.tnext, dense, t)
            return index + jnp.sum(crossed, 0, dtype=index.dtype), _write(saved, index, y_t, p.axis)

        return eqxi.while_loop(
            lambda c: jnp.any(due(c[0])), save, (s.save_index, s.saved), max_steps=n_save, kind=p.kind
        )

    def end(self, s: _State, zeros):
        """The n_save saved times: the padding dropped, the slots an init never reached inf."""
        n_save = self.ts.shape[0]
        unreached = jnp.arange(n_save)[None, :] >= s.save_index[:, None]
        return jax.tree.map(
            lambda x: jnp.where(
                unreached.reshape(unreached.shape + (1,) * (x.ndim - 2)), jnp.inf, x[:, :n_save]
            ),
            s.saved,
        )


class _Crossings(eqx.Module):
    """Hitting times: per init and target, the first accepted step whose end state has
    gap >= 0, and after the loop the time in that step where the gap reaches 0.

    The crossing is the root of gap(y(t)) on the step's dense output y(t), found by
    Chandrupatla's method (`_roots.chandrupatla`), so every accepted step is checked, not
    only saved times.
    """

    problem: _Problem
    gaps_of: Callable  # gaps(t, y, args) -> (targets,) of one init

    def gaps(self, t, y, batched):
        """The block's gaps, (targets, inits)."""
        p = self.problem
        one = lambda t, y, batched: self.gaps_of(t, y, p.args(batched))
        return jax.vmap(one, in_axes=p.axis, out_axes=-1)(t, y, batched)

    def start(self, tprev, y0, batched):
        """The crossings' carry: a target reached at the start has lo_t = hi_t = t0 (its
        dense output, never read, is y0 and zero stages)."""
        found = self.gaps(tprev, y0, batched) >= 0
        stack = lambda tree: jax.tree.map(lambda x: jnp.broadcast_to(x, found.shape[:1] + x.shape), tree)
        stages = len(self.problem.solver.tableau.c) + 1
        zero = jax.tree.map(jnp.zeros_like, y0)
        dense = dict(y0=y0, y1=y0, k=(zero,) * stages)
        return dict(found=found, lo_t=stack(tprev), hi_t=stack(tprev), lo_dense=stack(dense))

    def after_step(self, s: _State, keep, y, dense, batched):
        """The carry after the step from s.tprev to s.tnext reached y (with dense output
        `dense`), accepted where `keep`."""
        axis = self.problem.axis
        newly = keep[None] & ~s.found & (self.gaps(s.tnext, y, batched) >= 0)

        def first(buf, x):
            shape = [1] * x.ndim
            shape[axis] = keep.shape[0]
            return jnp.where(newly.reshape(newly.shape[:1] + tuple(shape)), x[None], buf)

        return dict(
            found=s.found | newly,
            lo_t=jnp.where(newly, s.tprev, s.lo_t),
            hi_t=jnp.where(newly, s.tnext, s.hi_t),
            # written in the few steps where some crossing is new: the dense output is
            # nine states per target, and selecting it every step cost a third of a flow
            lo_dense=jax.lax.cond(
                jnp.any(newly), lambda: jax.tree.map(first, s.lo_dense, dense), lambda: s.lo_dense
            ),
        )

    def locate_one(self, lo_t, hi_t, dense, batched, j):
        """One init's time in [lo_t, hi_t] where target j's gap reaches 0, on the dense
        output the loop kept of that step (no step is taken again)."""
        p = self.problem
        args = p.args(batched)
        gap = lambda t: self.gaps_of(t, p.interpolate(lo_t, hi_t, dense, t), args)[j]
        return chandrupatla(gap, lo_t, hi_t, self.gaps_of(lo_t, dense["y0"], args)[j], gap(hi_t))

    def locate(self, s: _State, batched):
        """(inits, targets) crossing times: t0 where reached at the start, inf where never."""
        axis = self.problem.axis
        locate = jax.vmap(self.locate_one, in_axes=(-1, -1, axis, axis, None))  # one target, over inits
        # located on the recorded step's dense output (not differentiated through)
        lo_t, hi_t, dense, args_b = jax.lax.stop_gradient((s.lo_t, s.hi_t, s.lo_dense, batched))
        at_start = s.found & (s.hi_t == s.lo_t)
        needed = s.found & ~at_start

        # one target at a time, each skipped where no init of the block reached it
        # inside the horizon (a default sweep's 0.99 level): the root finding's
        # iterations then run in lockstep over the block, not over every target too
        def one_target(x):
            j, need, lo_t, hi_t, dense = x
            return jax.lax.cond(jnp.any(need), lambda: locate(lo_t, hi_t, dense, args_b, j), lambda: hi_t)

        targets = jnp.arange(s.found.shape[0])
        located = jax.lax.map(one_target, (targets, needed, lo_t, hi_t, dense))
        return jnp.where(at_start, s.lo_t, jnp.where(s.found, located, jnp.inf)).T


def _finish(problem: _Problem, finish, saved, status, batched):
    """finish(ys, status, args) -> (outputs, status) of each init of the block (inits first)."""
    with_args = lambda ys, status, b: finish(ys, status, problem.args(b))
    return jax.vmap(with_args)(saved, status, batched)


def _is_explicit_rk(solver) -> bool:
    """Whether `solver` is an explicit Runge-Kutta method with one first-same-as-last tableau."""
    tableau = getattr(solver, "tableau", None)
    return (
        isinstance(solver, diffrax.AbstractERK)
        and isinstance(tableau, diffrax.ButcherTableau)
        and tableau.fsal
        and tableau.b_error is not None
    )


def _rk_step(tableau, field, t0, t1, y0, args, f0, *, rolled=False):
    """One step of an explicit Runge-Kutta tableau from diffrax.

    The same arithmetic as the solver's own `step` (increments k_j = dt f_j,
    stage y_i = y0 + sum_j a_ij k_j, y1 = y0 + sum_j b_j k_j, error sum_j e_j k_j), each
    sum over the tableau's nonzero coefficients in order. Written out (the default),
    every stage is its own copy of the field in the program, so that XLA fuses a whole
    step into a few kernels. `rolled`: the stages are a loop whose body evaluates the
    field once, the stage's sum chosen by `lax.switch` over the tableau's rows and its
    increment stored by selects. The same sums in the same order (the same numbers, to
    the bit, in every case measured), one copy of the field to compile instead of one
    per stage, and as fast for states stepped with the inits axis last; with the inits
    first the selects over the larger states cost about 10% (benchmarks/NOTES.md).

    Returns y1, the error estimate, the dense information for the solver's
    interpolation, and f(t1, y1) for the next step (first same as last).
    """
    dt = t1 - t0
    dtype = jnp.result_type(*jax.tree.leaves(y0))

    def combine(base, coeffs, ks):
        terms = [(float(c), k) for c, k in zip(coeffs, ks) if c != 0]

        def leaf(b, *k):
            out = b
            for (c, _), kk in zip(terms, k):
                out = out + jnp.asarray(c, dtype) * kk
            return out

        if base is None:
            zero = jax.tree.map(jnp.zeros_like, y0)
            return jax.tree.map(leaf, zero, *[k for _, k in terms])
        return jax.tree.map(leaf, base, *[k for _, k in terms])

    scale = lambda f: jax.tree.map(lambda x: x * dt.astype(x.dtype), f)

    def stage(i, ks):
        """(y_i, t_i) of stage i (from 0: the tableau's row i), from the increments so far."""
        c_i = tableau.c[i]
        t_i = t1 if c_i == 1 else t0 + jnp.asarray(c_i, dt.dtype) * dt
        return combine(y0, tableau.a_lower[i], ks[: i + 1]), t_i

    stages = len(tableau.c)
    if rolled:
        zero = jax.tree.map(jnp.zeros_like, y0)

        def body(i, carry):
            ks, _, _ = carry
            y_stage, t_i = jax.lax.switch(i, [lambda ks, r=r: stage(r, ks) for r in range(stages)], ks)
            f_i = field(t_i, y_stage, args)
            k = scale(f_i)
            ks = ks[:1] + tuple(
                jax.tree.map(lambda new, old, j=j: jnp.where(i + 1 == j, new, old), k, ks[j])
                for j in range(1, stages + 1)
            )
            return ks, y_stage, f_i

        ks, y_stage, f_i = jax.lax.fori_loop(0, stages, body, ((scale(f0),) + (zero,) * stages, y0, f0))
        ks = list(ks)
    else:
        ks = [scale(f0)]
        for i in range(stages):
            y_stage, t_i = stage(i, ks)
            f_i = field(t_i, y_stage, args)
            ks.append(scale(f_i))
    y1 = y_stage if tableau.ssal else combine(y0, tableau.b_sol, ks)
    y_error = combine(None, tableau.b_error, ks)
    return y1, y_error, dict(y0=y0, y1=y1, k=tuple(ks)), f_i
