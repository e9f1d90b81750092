"""The one integration engine behind `flow` and `modified_flow`: many initial states, one ODE.

`integrate(field, y0, args, ...)` solves dy/ds = field(s, y, args) for every
initialization, with y0 and the per-initialization part of `args` carrying a leading
inits axis (`args_axes` says which leaves, as `jax.vmap`'s in_axes). Times are in the
solver's clock (the caller maps physical time to it). The result holds the states at
the save times, a status code per initialization (`polarize.status`) and the number
of accepted steps.

`method="diffeqsolve"` is the reference: `jax.vmap(diffrax.diffeqsolve)` inside fixed
blocks of initializations (see `polarize.ensembles`), so results are bit-identical
whatever the batch size.
"""

from collections.abc import Callable
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from . import status as codes
from .ensembles import BLOCK_SIZE, blockwise
from .errors import check_choice

Method = Literal["diffeqsolve"]
METHODS = ("diffeqsolve",)


class Solution(eqx.Module):
    """States at the save times, per initialization: ys leaves are (inits, times, ...)."""

    ys: PyTree[Float[Array, "inits times ..."]]
    status: Int[Array, " inits"]
    steps: Int[Array, " inits"]


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
    ends_only: bool = False,
    solver: diffrax.AbstractSolver,
    rtol: float,
    atol: float,
    max_steps: int,
    adjoint: diffrax.AbstractAdjoint | None = None,
    block_size: int | None = None,
    method: Method = "diffeqsolve",
) -> Solution:
    """Solve dy/ds = field(s, y, args) from t0 to t1 for every initialization.

    Args:
        field: the vector field of ONE initialization, in solver time.
        y0: initial states, every leaf with a leading inits axis.
        args: the field's arguments; `args_axes` (a pytree prefix of `args`, 0 or None,
            as `jax.vmap`'s in_axes) marks the leaves batched over inits.
        t0, t1, ts: start, end and save times in solver time, shared by all inits
            (ts within [t0, t1]; ignored when `ends_only`, which saves t0 and t1).
        solver, rtol, atol, max_steps, adjoint: as for `diffrax.diffeqsolve` with a
            PID step-size controller.
        block_size: initializations per block (part of a result's bit-identity).
        method: "diffeqsolve" (reference).
    """
    check_choice("method", method, METHODS)
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
    saveat = diffrax.SaveAt(t0=True, t1=True) if ends_only else diffrax.SaveAt(ts=ts)
    batched, shared = _split(args, args_axes)

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
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=max_steps,
            adjoint=adjoint,
            throw=False,
        )
        return sol.ys, status_of(sol.result), sol.stats["num_accepted_steps"]

    ys, status, steps = blockwise(lambda x: solve_one(*x), (y0, batched), block_size=block_size or BLOCK_SIZE)
    return Solution(ys=ys, status=status, steps=steps)


def _split(args, args_axes):
    """(batched, shared) parts of `args` by its in_axes prefix `args_axes`."""
    is_none = lambda x: x is None
    mask = jax.tree.map(
        lambda ax, sub: jax.tree.map(lambda _: ax == 0, sub), args_axes, args, is_leaf=is_none
    )
    return eqx.partition(args, mask)
