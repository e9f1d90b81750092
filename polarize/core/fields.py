"""The gradient-flow vector field dtheta/dt = -grad L(theta), one class per exact form.

- `Autodiff`: `jax.grad` of L(model(theta)) over every trainable array. Works for any
  model and objective; the reference the others are tested against.
- `Analytic`: for `ValueAttention`, r = -grad L(beta) from the objective's closed form,
  then dV/dt = r s^T and da/dt = J_sigma(a)^T V^T r with the normalization's vjp.
- `Reduced`: for `ValueAttention` with a loss of one direction, L = l(<b, beta>)
  (`LogisticDirection`), the flow closes in the 2T numbers (u, a) with u = V^T b:
  du/dt = |b|^2 e s, da/dt = e J^T u, e = -l'(<u, s>), and
  V(t) = V(0) + b (u(t) - u(0))^T / |b|^2 exactly (|b| = 1 for `LogisticDirection`,
  but the field does not rely on it).
- `Span`: for `ValueAttention` with a dataset objective L = l(X beta), r = X^T e with
  e = -grad l(z), z = X V s, so V moves only in the row span of X: V(t) = V(0) + X^T W(t).
  The flow closes in (W, a), W of shape (samples, tokens): dW/dt = e s^T,
  da/dt = J^T (Z0 + K W)^T e, z = (Z0 + K W) s, with the constants Z0 = X V(0) and
  K = X X^T. Cheaper than `Analytic` when samples < dim.
- `Prompt`: for `PromptAttention` with a label objective (`LogisticLabels`,
  `SquareLabels`), dv/dt = sum_i e_i X_i^T s_i and dp/dt = sum_i e_i X_i^T J^T X_i v
  with e = -dL/df in closed form (`polarize.core._prompt.prompt_field`).
- `Modified(lr, base)`: the modified equation of gradient descent at step lr,
  dy/dt = f - (lr/2) f' f with f the base field: GD follows it to O(lr^2).

The four plain forms are the same ODE in different coordinates; they differ in cost.
`choose_field` picks the cheapest that applies. Because each is the exact negative
gradient in its coordinates, one explicit step y + lr f(y) is also exactly one
gradient-descent step on (V, a).
"""

import abc
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PyTree

from ._batching import Precision, at_precision, ensemble_size, float_dtype
from ._errors import PolarizeError, check_choice
from ._models import AbstractModel, ValueAttention, params, with_params
from ._objectives import AbstractDataObjective, AbstractObjective
from ._prompt import AbstractLabelObjective, PromptAttention, prompt_field
from ._trajectory import ValuePath, observe

Path = Literal["auto", "autodiff", "analytic", "reduced", "span", "prompt"]


def gradient(model: AbstractModel, objective: AbstractObjective) -> tuple:
    """grad L with respect to the trainable arrays, by autodiff (single initialization)."""
    return jax.grad(lambda p: objective(with_params(model, p)()))(params(model))


def modified_loss(model: AbstractModel, objective: AbstractObjective, lr: float) -> Array:
    """L + (lr/4) |grad L|^2 at `model` (single initialization), grad over the trainable arrays.

    Its negative gradient is the `Modified(lr, Autodiff())` field (the reference form).
    """
    loss = lambda p: objective(with_params(model, p)())
    grads = jax.grad(loss)(params(model))
    return loss(params(model)) + 0.25 * lr * sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))


class AbstractField(eqx.Module):
    """dy/dt for one initialization in coordinates y, and the way between y and (V, a).

    `constants` are per-initialization arrays the field reuses at every evaluation,
    `initial` maps the model to y(0), `value_path` maps saved states back to the
    trainable arrays (V kept in the field's own subspace, see `ValuePath`).
    `euclidean` is True when y is the trainable arrays themselves,
    so that any optimizer (not only plain gradient descent) may step in y.
    """

    euclidean: ClassVar[bool] = True

    @staticmethod
    def requires(model: AbstractModel, objective: AbstractObjective) -> str | None:
        """None when the form applies to (model, objective), else what it needs."""
        return None

    def constants(self, model: AbstractModel, objective: AbstractObjective) -> PyTree | None:
        return None

    def initial(self, model: AbstractModel, objective: AbstractObjective) -> PyTree:
        return params(model)

    @abc.abstractmethod
    def field(self, y: PyTree, model: AbstractModel, objective: AbstractObjective, constants=None) -> PyTree:
        """dy/dt at state y (physical time). `constants` as from `self.constants` (computed if None)."""

    def __call__(self, y, model, objective, constants=None) -> PyTree:
        return self.field(y, model, objective, constants)

    def value_path(self, ys: PyTree, model: AbstractModel, objective: AbstractObjective) -> tuple:
        """(values as a `ValuePath`, logits) at every saved time (leading axis) from the saved states ys.

        For `PromptAttention` these are v as a (dim, 1) column and p (`Trajectory.v`, `.p`).
        """
        if isinstance(model, PromptAttention):
            p = ys[-1]
            v = jnp.broadcast_to(model.v, p.shape) if model.train == "p" else ys[0]
            return ValuePath(coords=v[..., None]), p
        V, a = ys
        return ValuePath(coords=V), a

    def observe(self, y: PyTree, model: AbstractModel, objective: AbstractObjective, constants=None) -> tuple:
        """(attention weights, loss) at one state y: what hitting times check at every step."""
        path, a = self.value_path(jax.tree.map(lambda x: x[None], y), model, objective)
        weights, loss = observe(model, objective, path, a)
        return weights[0], loss[0]


class Autodiff(AbstractField):
    """-grad L over the trainable arrays by `jax.grad`: any model, any objective."""

    def field(self, y, model, objective, constants=None):
        return jax.tree.map(jnp.negative, gradient(with_params(model, y), objective))


class Analytic(AbstractField):
    """dV/dt = r s^T, da/dt = J^T V^T r with r = -grad L(beta) in closed form."""

    @staticmethod
    def requires(model, objective):
        return None if isinstance(model, ValueAttention) else "a ValueAttention model"

    def field(self, y, model, objective, constants=None):
        V, a = y
        s = model.norm(a)
        r = -objective.grad(V @ s)
        return (jnp.outer(r, s), model.norm.vjp(a, V.T @ r))


class Reduced(AbstractField):
    """The flow in (u, a), u = V^T b, for a loss of one direction b."""

    euclidean: ClassVar[bool] = False

    @staticmethod
    def requires(model, objective):
        if isinstance(model, ValueAttention) and objective.direction() is not None:
            return None
        return "a ValueAttention model with a LogisticDirection objective (a loss of <b, beta>)"

    def constants(self, model, objective):
        b = objective.direction()
        return jnp.dot(b, b)

    def initial(self, model, objective):
        return (model.V.T @ objective.direction(), model.a)

    def field(self, y, model, objective, constants=None):
        bb = self.constants(model, objective) if constants is None else constants
        u, a = y
        s = model.norm(a)
        e = objective.residual(jnp.dot(u, s))
        return (bb * e * s, e * model.norm.vjp(a, u))

    def observe(self, y, model, objective, constants=None):
        # L = l(<b, V s>) = l(<u, s>), without V (the margin summed out, not a dot: vmapped
        # over saved times a dot becomes many tiny matrix products)
        u, a = y
        s = model.norm(a)
        return s, objective.of_margin(jnp.sum(u * s))

    def value_path(self, ys, model, objective):
        u, a = ys
        b = objective.direction()
        u0 = model.V.T @ b
        return ValuePath(
            coords=((u - u0[None]) / jnp.dot(b, b))[:, None, :], offset=model.V, basis=b[:, None]
        ), a


class Span(AbstractField):
    """The flow in (W, a) with V = V(0) + X^T W, for a dataset objective L = l(X beta)."""

    euclidean: ClassVar[bool] = False

    @staticmethod
    def requires(model, objective):
        if isinstance(model, ValueAttention) and isinstance(objective, AbstractDataObjective):
            return None
        return "a ValueAttention model with a Square or LogisticData objective"

    def constants(self, model, objective):
        X = objective.X
        return (X @ model.V, X @ X.T)

    def initial(self, model, objective):
        return (jnp.zeros(objective.X.shape[:1] + model.a.shape, model.V.dtype), model.a)

    def field(self, y, model, objective, constants=None):
        Z0, K = self.constants(model, objective) if constants is None else constants
        W, a = y
        s = model.norm(a)
        e = objective.residual(Z0 @ s + K @ (W @ s))
        f = Z0.T @ e + W.T @ (K @ e)  # fitness V^T r = (Z0 + K W)^T e
        return (jnp.outer(e, s), model.norm.vjp(a, f))

    def value_path(self, ys, model, objective):
        W, a = ys
        return ValuePath(coords=W, offset=model.V, basis=objective.X.T), a


class Prompt(AbstractField):
    """dv/dt = sum_i e_i X_i^T s_i, dp/dt = sum_i e_i X_i^T J^T X_i v for `PromptAttention`."""

    @staticmethod
    def requires(model, objective):
        if isinstance(model, PromptAttention) and isinstance(objective, AbstractLabelObjective):
            return None
        return "a PromptAttention model with a LogisticLabels or SquareLabels objective"

    def field(self, y, model, objective, constants=None):
        return prompt_field(model, objective, y)

    def observe(self, y, model, objective, constants=None):
        m = with_params(model, y)
        return m.weights(), objective(m())


class Modified(AbstractField):
    """dy/dt = f - (lr/2) f'(y) f(y), f the base field: what GD at step lr follows to O(lr^2).

    For f = -grad L this is -grad(L + (lr/4)|grad L|^2) (Hairer, Lubich & Wanner;
    Barrett & Dherin 2021). In reduced coordinates GD is the same iteration, so the same
    formula holds there. lr = 0 gives the base field.
    """

    lr: Float[ArrayLike, ""]
    base: AbstractField = Autodiff()

    def constants(self, model, objective):
        return self.base.constants(model, objective)

    def initial(self, model, objective):
        return self.base.initial(model, objective)

    def field(self, y, model, objective, constants=None):
        constants = self.base.constants(model, objective) if constants is None else constants
        f = lambda y: self.base.field(y, model, objective, constants)
        dy = f(y)
        _, curvature = jax.jvp(f, (y,), (dy,))
        return jax.tree.map(lambda d, c: d - 0.5 * self.lr * c, dy, curvature)

    def value_path(self, ys, model, objective):
        return self.base.value_path(ys, model, objective)

    def observe(self, y, model, objective, constants=None):
        return self.base.observe(y, model, objective, constants)


#: The registry: each `path` name and its field class, written once.
FIELDS: dict[str, type[AbstractField]] = {
    "autodiff": Autodiff,
    "analytic": Analytic,
    "reduced": Reduced,
    "span": Span,
    "prompt": Prompt,
}
PATHS = ("auto", *FIELDS)


def choose_field(
    model: AbstractModel, objective: AbstractObjective, path: Path = "auto", *, euclidean: bool = False
) -> AbstractField:
    """The vector field for `path`; refuses a forced form that does not apply.

    "auto": `Reduced` for a loss of one direction, `Span` for a dataset objective with
    fewer samples than dims, else `Analytic` for `ValueAttention`, `Prompt` for
    `PromptAttention` with a label objective, else `Autodiff`.
    `euclidean=True` keeps to forms whose state is (V, a) itself (for optax optimizers).
    """
    check_choice("path", path, PATHS)
    if path == "auto":
        span = Span.requires(model, objective) is None and objective.X.shape[-2] < model.V.shape[-2]
        reduced = [] if euclidean else [Reduced] + ([Span] if span else [])
        candidates = reduced + [Analytic, Prompt, Autodiff]
        return next(cls for cls in candidates if cls.requires(model, objective) is None)()
    cls = FIELDS[path]
    need = cls.requires(model, objective)
    if need is not None:
        raise PolarizeError(
            f"`path={path!r}` needs {need}; got {type(model).__name__} with {type(objective).__name__}"
        )
    if euclidean and not cls.euclidean:
        raise PolarizeError(
            f"`path={path!r}` steps in reduced coordinates, exact only for plain gradient "
            "descent: pass a float learning rate as `optimizer`"
        )
    return cls()


def same_dimension(model: AbstractModel, objective: AbstractObjective) -> None:
    """Refuse a model whose output (beta = V sigma(a); a prompt model's outputs, one per
    sample) has another length than the objective takes."""
    want = objective.beta_dim
    if want is None:
        return
    dim = jax.eval_shape(model).shape[-1]  # (*inits, dim): shapes only
    if dim == want:
        return
    if next(iter(objective.core_ndim)) == "y":  # labels, one per output
        raise PolarizeError(
            f"`model` gives {dim} outputs but `objective` {type(objective).__name__} holds {want} "
            "labels; build both from the same task (its samples)"
        )
    raise PolarizeError(
        f"`model` gives beta of dimension {dim} but `objective` {type(objective).__name__} "
        f"takes dimension {want}; build both with the same dim"
    )


def not_empty(model: AbstractModel, objective: AbstractObjective, precision) -> None:
    """Refuse an empty model or objective (no inits, tokens, dims or samples) and, where no
    `precision` casts it, a model whose trainable arrays are not float32 or float64."""
    for name, module in (("model", model), ("objective", objective)):
        for leaf in jax.tree.leaves(module):
            if hasattr(leaf, "shape") and 0 in leaf.shape:
                raise PolarizeError(
                    f"`{name}` {type(module).__name__} holds an empty array (shape {leaf.shape}): it needs "
                    "at least one initialization, token, dimension and sample"
                )
    dtype = float_dtype(model)
    if precision is None and (not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize < 4):
        raise PolarizeError(f"`model`'s arrays must be float32 or float64; got {jnp.dtype(dtype).name}")


def prepare(
    model: AbstractModel,
    objective: AbstractObjective,
    *,
    path: Path = "auto",
    precision: Precision | None = None,
    euclidean: bool = False,
) -> tuple[AbstractModel, AbstractObjective, AbstractField]:
    """The common preamble of `flow`, `modified_flow` and `descend`, with its checks.

    Casts model and objective to `precision` (default: the model's dtype, which the
    objective follows), checks that they hold the same number of initializations and
    and chooses the field. Returns (model, objective, field).
    """
    not_empty(model, objective, precision)
    precision = precision or jnp.dtype(float_dtype(model)).name
    model, objective = at_precision((model, objective), precision)
    ensemble_size(model, objective)
    same_dimension(model, objective)
    return model, objective, choose_field(model, objective, path, euclidean=euclidean)
