"""Prompt attention: f_i = v^T X_i^T sigma(X_i p), the logits scores of token embeddings.

In the value-softmax model every logit is a free parameter. In a real attention head
the logits are scores `X_i p` of the tokens x_{i,1..T} of sample i against one trained
vector p (the prompt, or the query-key product of Tarzanagh et al., "Max-Margin Token
Selection in Attention Mechanism", NeurIPS 2023). The data X (samples, tokens, dim)
are shared by every initialization; v and p are (dim,), or (inits, dim).

With X = I (one sample, tokens = dim) the model is `ValueAttention` with the value
matrix v^T (dim 1) and logits a = p: f = v^T sigma(p).
"""

import abc
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._errors import PolarizeError, check_choice, check_positive
from ._models import AbstractModel, as_key, finite, first_index, init_keys
from ._normalizations import AbstractNormalization, Softmax, normalization
from ._objectives import AbstractObjective
from ._refuse import refuse_if

Train = Literal["p", "vp"]


class PromptAttention(AbstractModel):
    """f_i = v^T X_i^T sigma(X_i p) for every sample i: one output per sample.

    `train="p"` moves p only (v fixed: the max-margin theorems' setting), `"vp"` both.
    Gradient flow on L(f) with e = -dL/df gives
    dv/dt = sum_i e_i X_i^T s_i and dp/dt = sum_i e_i X_i^T J_sigma(X_i p)^T X_i v,
    s_i = sigma(X_i p).
    """

    v: Float[Array, "*batch dim"]
    p: Float[Array, "*batch dim"]
    X: Float[Array, "samples tokens dim"]
    norm: AbstractNormalization = eqx.field(default_factory=Softmax)
    train: Train = eqx.field(static=True, default="p")
    core_ndim: ClassVar[dict[str, int]] = {"v": 1, "p": 1}

    def __init__(self, v, p, X, norm: AbstractNormalization | str = "softmax", train: Train = "p"):
        self.v = finite("v", jnp.asarray(v))
        self.p = finite("p", jnp.asarray(p))
        self.X = finite("X", jnp.asarray(X))
        self.norm = normalization(norm)
        self.train = check_choice("train", train, ("p", "vp"))

    def __check_init__(self):
        if self.X.ndim != 3:
            raise PolarizeError(f"`X` must have shape (samples, tokens, dim); got {self.X.shape}")
        if self.p.ndim not in (1, 2) or self.p.shape[-1] != self.X.shape[-1]:
            raise PolarizeError(
                f"`p` must have shape (dim,) or (inits, dim) with dim = {self.X.shape[-1]} "
                f"(the last axis of `X`); got {self.p.shape}"
            )
        if self.v.shape != self.p.shape:
            raise PolarizeError(f"`v` must have the shape of `p`, {self.p.shape}; got {self.v.shape}")

    @property
    def trainable(self) -> tuple[str, ...]:
        return ("p",) if self.train == "p" else ("v", "p")

    def logits(self) -> Float[Array, "*batch samples tokens"]:
        """The scores X_i p of every token of every sample."""
        return jnp.einsum("ntd,...d->...nt", self.X, self.p)

    def values(self) -> Float[Array, "*batch samples tokens"]:
        """The values X_i v of every token of every sample."""
        return jnp.einsum("ntd,...d->...nt", self.X, self.v)

    def __call__(self) -> Float[Array, "*batch samples"]:
        """f_i = <X_i v, sigma(X_i p)>."""
        return jnp.sum(self.values() * self.weights(), axis=-1)

    @property
    def tokens(self) -> int:
        return self.X.shape[1]

    def at_state(self, values, logits) -> "PromptAttention":
        """The model at a saved state: v from `values` (dim, 1) and p from `logits`."""
        v = values[..., 0]
        return eqx.tree_at(lambda m: (m.v, m.p), self, (v, logits))


class AbstractLabelObjective(AbstractObjective):
    """L(f) of the outputs f (samples,) and labels y, with e = -dL/df in closed form."""

    y: eqx.AbstractVar[Float[Array, " samples"]]
    core_ndim: ClassVar[dict[str, int]] = {"y": 1}

    @abc.abstractmethod
    def residual(self, f: Float[Array, " samples"]) -> Float[Array, " samples"]:
        """e = -dL/df."""

    def grad(self, f):
        return -self.residual(f)


class LogisticLabels(AbstractLabelObjective):
    """L = mean_i log(1 + exp(-y_i f_i)), y in {-1, +1}; e_i = y_i sigmoid(-y_i f_i) / n."""

    y: Float[Array, " samples"]

    def __init__(self, y):
        y = finite("y", _labels(y))
        self.y = refuse_if(
            y, lambda y, xp: xp.abs(y) != 1, "`y` must hold labels -1 or +1 for LogisticLabels"
        )

    def __call__(self, f):
        return jnp.mean(jax.nn.softplus(-self.y * f))

    def residual(self, f):
        return self.y * jax.nn.sigmoid(-self.y * f) / f.shape[-1]


class SquareLabels(AbstractLabelObjective):
    """L = mean_i (y_i - f_i)^2; e_i = 2 (y_i - f_i) / n."""

    y: Float[Array, " samples"]

    def __init__(self, y):
        self.y = finite("y", _labels(y))

    def __call__(self, f):
        return jnp.mean(jnp.square(self.y - f))

    def residual(self, f):
        return 2 * (self.y - f) / f.shape[-1]

    def curvature(self) -> Array:
        """A scale of the loss's curvature in f: 2 / n."""
        return jnp.asarray(2.0 / self.y.shape[-1])


def _labels(y):
    y = jnp.asarray(y, dtype=jnp.result_type(float))
    if y.ndim != 1:
        raise PolarizeError(f"`y` must have shape (samples,); got {y.shape}")
    return y


def prompt_field(model: PromptAttention, objective: AbstractLabelObjective, y) -> tuple:
    """-grad L over the trainable arrays of one initialization, in closed form.

    `y` holds the trainable arrays ((p,) or (v, p)); the rest comes from `model`.
    """
    v, p = (model.v, y[0]) if model.train == "p" else y
    X = model.X
    scores, values = X @ p, X @ v  # (samples, tokens)
    s = model.norm(scores)
    e = objective.residual(jnp.sum(values * s, axis=-1))
    dp = X.reshape(-1, X.shape[-1]).T @ model.norm.vjp(scores, e[:, None] * values).reshape(-1)
    if model.train == "p":
        return (dp,)
    dv = X.reshape(-1, X.shape[-1]).T @ (e[:, None] * s).reshape(-1)
    return (dv, dp)


def prompt_task(key: PRNGKeyArray | int, samples: int, tokens: int, dim: int) -> tuple:
    """(X, y, v): tokens X ~ N(0, 1) of shape (samples, tokens, dim), labels y = +-1 at
    random, and a value vector v ~ N(0, I_dim)."""
    samples = check_positive("samples", samples, integer=True)
    tokens = check_positive("tokens", tokens, integer=True)
    dim = check_positive("dim", dim, integer=True)
    kx, ky, kv = jax.random.split(as_key(key), 3)
    X = jax.random.normal(kx, (samples, tokens, dim))
    y = jnp.where(jax.random.bernoulli(ky, 0.5, (samples,)), 1.0, -1.0)
    return X, y, jax.random.normal(kv, (dim,))


def init_prompts(
    key: PRNGKeyArray | int,
    n: int,
    X,
    v,
    *,
    p_scale: float = 0.3,
    v_scale: float | None = None,
    norm: AbstractNormalization | str = "softmax",
    train: Train = "p",
    start: int = 0,
) -> PromptAttention:
    """n initializations p(0) ~ p_scale N(0, I): initialization i (counted from `start`)
    from fold_in(key, i), so it is the same whatever n or the chunking.

    v is the given `v` for every initialization, or, with `v_scale`, v(0) ~ v_scale N(0, I)
    drawn from the same key (for joint training).
    """
    X, v = jnp.asarray(X), jnp.asarray(v)
    dim = X.shape[-1]
    n = check_positive("n", n, integer=True)
    first_index(start, n)  # checked
    draw = jax.vmap(lambda k: jax.random.normal(k, (2, dim), X.dtype))(init_keys(key, n, start))
    p = p_scale * draw[:, 0]
    vs = jnp.broadcast_to(v, (n, dim)) if v_scale is None else v_scale * draw[:, 1]
    return PromptAttention(vs, p, X, norm=norm, train=train)
