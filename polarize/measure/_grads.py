"""Gradients through the dynamics: differentiable statistics of the final state, and adjoints.

`flow` and `descend` are ordinary JAX functions of their inputs, so any smooth scalar
of the state at time t can be differentiated with `jax.grad`: with respect to V(0)
and a(0), the objective's arrays, the normalization's parameters (a temperature, a
sink logit) and t1 itself. The statistics below read the last saved time and are
batched like the trajectory: sum them for an ensemble (each term depends on its own
initialization only, so the gradient of the sum holds every per-init gradient).

Adjoints (how `flow` is differentiated; pass one as `flow(..., adjoint=...)`):

- "checkpoint": `diffrax.RecursiveCheckpointAdjoint`, the default. Reverse mode through
  the solver's own steps, exact for the discretized solve; memory grows with the
  checkpoints kept (about log of `max_steps`), not with the horizon. Differentiates
  everything, t1 included.
- "backsolve": `diffrax.BacksolveAdjoint`. Solves the adjoint ODE backwards: constant
  memory, but the gradient is only as accurate as the backward solve (error of the
  order of the tolerances) and t0, t1 and the save times cannot be differentiated.
- "forward": `diffrax.ForwardMode`, for `jax.jvp` / `jax.jacfwd` (reverse mode is not
  available with it). Cost grows with the number of input directions: the choice for
  few inputs (a temperature, t1) and many outputs (a whole trajectory).
"""

import diffrax
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..core._errors import check_choice
from ..core._trajectory import Trajectory
from ._statistics import distribution, entropy

ADJOINTS: dict[str, type[diffrax.AbstractAdjoint]] = {
    "checkpoint": diffrax.RecursiveCheckpointAdjoint,
    "backsolve": diffrax.BacksolveAdjoint,
    "forward": diffrax.ForwardMode,
}


def adjoint(name: str) -> diffrax.AbstractAdjoint:
    """The diffrax adjoint registered under `name` (see `ADJOINTS`)."""
    return ADJOINTS[check_choice("adjoint", name, ADJOINTS)]()


def final_entropy(traj: Trajectory) -> Float[Array, "*inits"]:
    """H(p) at the last saved time, p = |s| / sum |s| (natural log)."""
    return _entropy_at_last(traj.weights)


@jax.jit
def _entropy_at_last(weights):
    """One program: operation by operation, a first call compiled 14 small ones (0.6 s
    for the toy's 1000 inits). The same operations, so the same numbers."""
    return entropy(distribution(weights[..., -1, :]))


def final_max_weight(traj: Trajectory) -> Float[Array, "*inits"]:
    """max_j s_j(t1) of the raw weights (below one for softmax1: the sink keeps the rest)."""
    return jnp.max(traj.weights[..., -1, :], axis=-1)


def final_loss(traj: Trajectory) -> Float[Array, "*inits"]:
    """L(beta(t1))."""
    return traj.loss[..., -1]
