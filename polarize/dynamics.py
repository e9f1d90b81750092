"""The gradient-flow vector field dtheta/dt = -grad L(theta), in three exact forms.

- "autodiff": `jax.grad` of L(model(theta)) over every trainable array. Works for
  any model and objective; the reference the others are tested against.
- "analytic": for `ValueAttention`, r = -grad L(beta) by autodiff in beta alone, then
  dV/dt = r s^T and da/dt = J_sigma(a)^T V^T r with the normalization's closed-form vjp.
- "reduced": for `ValueAttention` with `LogisticDirection`, the flow closes in the
  2T numbers (u, a) with u = V^T b:  du/dt = g s,  da/dt = g J^T u,
  g = sigmoid(-<u, s>), and V(t) = V(0) + b (u(t) - u(0))^T exactly.

All three are the same ODE; they differ in cost. "auto" picks the cheapest that applies.
"""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from .errors import PolarizeError, check_choice
from .models import AbstractModel, ValueAttention
from .objectives import AbstractObjective, LogisticDirection

Path = Literal["auto", "autodiff", "analytic", "reduced"]
PATHS = ("auto", "autodiff", "analytic", "reduced")


def params(model: AbstractModel) -> tuple:
    """The trainable arrays of `model`, in `model.trainable` order."""
    return tuple(getattr(model, name) for name in model.trainable)


def with_params(model: AbstractModel, values) -> AbstractModel:
    """`model` with its trainable arrays replaced by `values`."""
    return eqx.tree_at(lambda m: [getattr(m, n) for n in m.trainable], model, list(values))


def gradient(model: AbstractModel, objective: AbstractObjective) -> tuple:
    """grad L with respect to the trainable arrays, by autodiff (single initialization)."""
    return jax.grad(lambda p: objective(with_params(model, p)()))(params(model))


def choose_path(model: AbstractModel, objective: AbstractObjective, path: Path = "auto") -> str:
    """The vector-field form to use; refuses a forced form that does not apply."""
    check_choice("path", path, PATHS)
    value_attention = type(model) is ValueAttention
    reducible = value_attention and type(objective) is LogisticDirection
    if path == "auto":
        return "reduced" if reducible else "analytic" if value_attention else "autodiff"
    if path == "reduced" and not reducible:
        raise PolarizeError(
            "`path='reduced'` needs a ValueAttention model with a LogisticDirection objective; "
            f"got {type(model).__name__} with {type(objective).__name__}"
        )
    if path == "analytic" and not value_attention:
        raise PolarizeError(f"`path='analytic'` needs a ValueAttention model; got {type(model).__name__}")
    return path


class System(eqx.Module):
    """The ODE state for one initialization, its vector field, and the way back to (V, a)."""

    path: str = eqx.field(static=True)

    def initial(self, model, objective):
        if self.path == "reduced":
            return (model.V.T @ objective.b, model.a)
        return params(model)

    def field(self, y, model, objective):
        """dy/dt at state y (physical time)."""
        norm = model.norm
        if self.path == "reduced":
            u, a = y
            s = norm(a)
            g = jax.nn.sigmoid(-jnp.dot(u, s))
            return (g * s, g * norm.vjp(a, u))
        if self.path == "analytic":
            V, a = y
            s = norm(a)
            r = -jax.grad(objective)(V @ s)
            return (jnp.outer(r, s), norm.vjp(a, V.T @ r))
        grads = gradient(with_params(model, y), objective)
        return jax.tree.map(jnp.negative, grads)

    def trainable(self, ys, model, objective) -> tuple:
        """The trainable arrays at every saved time from the saved states ys."""
        if self.path == "reduced":
            u, a = ys
            u0 = model.V.T @ objective.b
            V = model.V[None] + objective.b[None, :, None] * (u - u0[None])[:, None, :]
            return (V, a)
        return ys
