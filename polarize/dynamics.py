"""The gradient-flow vector field dtheta/dt = -grad L(theta), in four exact forms.

- "autodiff": `jax.grad` of L(model(theta)) over every trainable array. Works for
  any model and objective; the reference the others are tested against.
- "analytic": for `ValueAttention`, r = -grad L(beta) by autodiff in beta alone, then
  dV/dt = r s^T and da/dt = J_sigma(a)^T V^T r with the normalization's closed-form vjp.
- "reduced": for `ValueAttention` with `LogisticDirection`, the flow closes in the
  2T numbers (u, a) with u = V^T b:  du/dt = g s,  da/dt = g J^T u,
  g = sigmoid(-<u, s>), and V(t) = V(0) + b (u(t) - u(0))^T exactly.
- "span": for `ValueAttention` with a dataset objective L = l(X beta) (`Square`,
  `LogisticData`), r = X^T e with e = -grad l(z), z = X V s, so V moves only in the
  row span of X: V(t) = V(0) + X^T W(t). The flow closes in (W, a), W of shape
  (samples, tokens):  dW/dt = e s^T,  da/dt = J^T (Z0 + K W)^T e,  z = (Z0 + K W) s,
  with the constants Z0 = X V(0) and K = X X^T. Cheaper than "analytic" when
  samples < dim; V is rebuilt exactly from W.

All four are the same ODE; they differ in cost. "auto" picks the cheapest that applies.
Because each field is the exact negative gradient in its coordinates, one explicit
step y + lr * field(y) is also exactly one gradient-descent step on (V, a).
"""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from .errors import PolarizeError, check_choice
from .models import AbstractModel, ValueAttention
from .objectives import AbstractObjective, LogisticData, LogisticDirection, Square

Path = Literal["auto", "autodiff", "analytic", "reduced", "span"]
PATHS = ("auto", "autodiff", "analytic", "reduced", "span")
DATA_OBJECTIVES = (Square, LogisticData)


def params(model: AbstractModel) -> tuple:
    """The trainable arrays of `model`, in `model.trainable` order."""
    return tuple(getattr(model, name) for name in model.trainable)


def with_params(model: AbstractModel, values) -> AbstractModel:
    """`model` with its trainable arrays replaced by `values`."""
    return eqx.tree_at(lambda m: [getattr(m, n) for n in m.trainable], model, list(values))


def gradient(model: AbstractModel, objective: AbstractObjective) -> tuple:
    """grad L with respect to the trainable arrays, by autodiff (single initialization)."""
    return jax.grad(lambda p: objective(with_params(model, p)()))(params(model))


def data_residual(objective: Square | LogisticData, z):
    """e = -grad_z l(z) for L(beta) = l(X beta), in closed form."""
    if type(objective) is Square:
        return 2 * (objective.y - z)
    return objective.y * jax.nn.sigmoid(-objective.y * z) / z.shape[-1]


def choose_path(model: AbstractModel, objective: AbstractObjective, path: Path = "auto") -> str:
    """The vector-field form to use; refuses a forced form that does not apply.

    "auto": "reduced" for logistic direction, "span" for a dataset objective with
    fewer samples than dims, else "analytic" for `ValueAttention`, else "autodiff".
    """
    check_choice("path", path, PATHS)
    value_attention = type(model) is ValueAttention
    reducible = value_attention and type(objective) is LogisticDirection
    spannable = value_attention and type(objective) in DATA_OBJECTIVES
    if path == "auto":
        if reducible:
            return "reduced"
        if spannable and objective.X.shape[-2] < model.V.shape[-2]:
            return "span"
        return "analytic" if value_attention else "autodiff"
    if path == "reduced" and not reducible:
        raise PolarizeError(
            "`path='reduced'` needs a ValueAttention model with a LogisticDirection objective; "
            f"got {type(model).__name__} with {type(objective).__name__}"
        )
    if path == "span" and not spannable:
        raise PolarizeError(
            "`path='span'` needs a ValueAttention model with a Square or LogisticData objective; "
            f"got {type(model).__name__} with {type(objective).__name__}"
        )
    if path == "analytic" and not value_attention:
        raise PolarizeError(f"`path='analytic'` needs a ValueAttention model; got {type(model).__name__}")
    return path


class System(eqx.Module):
    """The ODE state for one initialization, its vector field, and the way back to (V, a)."""

    path: str = eqx.field(static=True)

    def constants(self, model, objective):
        """Per-initialization arrays the field reuses at every evaluation (None if none)."""
        if self.path == "span":
            X = objective.X
            return (X @ model.V, X @ X.T)
        return None

    def initial(self, model, objective):
        if self.path == "reduced":
            return (model.V.T @ objective.b, model.a)
        if self.path == "span":
            return (jnp.zeros(objective.X.shape[:1] + model.a.shape, model.V.dtype), model.a)
        return params(model)

    def field(self, y, model, objective, constants=None):
        """dy/dt at state y (physical time). `constants` as from `self.constants`."""
        norm = model.norm
        if self.path == "reduced":
            u, a = y
            s = norm(a)
            g = jax.nn.sigmoid(-jnp.dot(u, s))
            return (g * s, g * norm.vjp(a, u))
        if self.path == "span":
            Z0, K = self.constants(model, objective) if constants is None else constants
            W, a = y
            s = norm(a)
            e = data_residual(objective, Z0 @ s + K @ (W @ s))
            f = Z0.T @ e + W.T @ (K @ e)  # fitness V^T r = (Z0 + K W)^T e
            return (jnp.outer(e, s), norm.vjp(a, f))
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
        if self.path == "span":
            W, a = ys
            return (model.V[None] + jnp.einsum("nd,tnk->tdk", objective.X, W), a)
        return ys
