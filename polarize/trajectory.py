"""The common result of `flow` and `descend`: states at saved times, per initialization."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .models import with_params


class Trajectory(eqx.Module):
    """Saved states. Arrays are (inits, times, ...) for a batched model, (times, ...) otherwise.

    `ts` are the times (shared by all initializations): flow time, or steps x lr for
    descent. `status` holds a `polarize.status` code per initialization (OK,
    MAX_STEPS, SOLVER_FAILED, NONFINITE, DIVERGED) and `ok` is `status == OK`.
    `steps` is the step index (descent) or the number of accepted solver steps
    (flow, per initialization).
    """

    ts: Float[Array, " times"]
    V: Float[Array, "*inits times dim tokens"]
    a: Float[Array, "*inits times logits"]
    weights: Float[Array, "*inits times tokens"]
    loss: Float[Array, "*inits times"]
    ok: Bool[Array, "*inits"]
    status: Int[Array, "*inits"]
    steps: Int[Array, "*inits times"] | Int[Array, "*inits"] | None = None

    @property
    def batched(self) -> bool:
        return self.ok.ndim == 1

    def at(self, i: int) -> "Trajectory":
        """Initialization i of a batched trajectory."""
        return jax.tree.map(lambda x: x if x is self.ts else x[i], self)

    def final(self, model):
        """The model at the last saved time (batched like the input model)."""
        return with_params(model, (self.V[..., -1, :, :], self.a[..., -1, :]))


def observe(model, objective, trainable_ts):
    """Weights and loss of one initialization along saved trainable arrays (time first)."""

    def at_time(p):
        m = with_params(model, p)
        return m.weights(), objective(m())

    return jax.vmap(at_time)(trainable_ts)


def all_finite(tree) -> Bool[Array, ""]:
    """True when every array in `tree` is finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
