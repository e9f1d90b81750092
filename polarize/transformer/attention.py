"""Attention maps: weights `A[h, i, j]` from queries and keys under a mask.

The map from scores to weights is a normalization of `polarize.core` wherever it
is the same function (softmax, softmax1, sigmoid, sigmoid-norm, sparsemax, the identity);
this module adds only what attention needs on top: the mask, feature kernels on q and k
(`elu + 1`, an MLP), a uniform map and the row rescalings of the paper's code.

Every map takes `q: [heads, queries, d]`, `k: [heads, keys, d]` and a boolean
`mask: [queries, keys]` (True = may attend) and returns weights `[heads, queries, keys]`
that are exactly zero where the mask is False. Scores are `s = q k^T / sqrt(d)`.
Strings become objects only through `make_attention(name, heads=..., head_dim=..., key=...)`,
with the names of `ATTENTIONS`; the paper's code (tml-epfl/softmax) calls them:

    softmax, uniform, sigmoid_unnorm = sigmoid, sigmoid_norm = sigmoid-norm,
    coupled_linear_(un)norm = elu(-norm), linear(_unnorm) = elu-kernel(-norm),
    raw_dotproduct_(un)norm = linear(-norm), mlp_(un)norm = mlp(-norm).
"""

import abc
import math
from collections.abc import Callable
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from ..core import _normalizations as nz
from ..core._errors import check_choice

Q = Float[Array, "heads queries dim"]
K = Float[Array, "heads keys dim"]
Mask = Bool[Array, "queries keys"]
Weights = Float[Array, "heads queries keys"]
Rows = Literal["none", "sum", "clip"]

# A masked score: finite, so every map (sort in sparsemax, sums) stays finite, yet far
# enough below any real score that exp, sigmoid and elu + 1 give exactly 0 there.
_MASKED = -1e9


class EluPlusOne(nz.AbstractNormalization):
    """Elementwise `elu(a) + 1 > 0`, not normalized; used on scores and as a feature map."""

    simplex: ClassVar[bool] = False

    def __call__(self, a):
        return jax.nn.elu(a) + 1

    def vjp(self, a, c):
        return jnp.where(a > 0, 1.0, jnp.exp(jnp.minimum(a, 0.0))) * c


def _rescale(a: Weights, rows: Rows) -> Weights:
    """`sum`: `a / sum_j a` (nonnegative maps); `clip`: `a / max(|sum_j a|, 1)`."""
    if rows == "sum":
        return nz.SumNorm()(a)
    if rows == "clip":
        total = jnp.abs(jnp.sum(a, axis=-1, keepdims=True))
        return a / jnp.maximum(total, jnp.ones((), a.dtype))
    return a


def _gelu(x):
    return jax.nn.gelu(x, approximate=False)  # torch's default GELU, as in the paper's code


def _zero_masked(a: Weights, mask: Mask) -> Weights:
    return jnp.where(mask[None], a, jnp.zeros((), a.dtype))


class AbstractAttention(eqx.Module):
    """Maps queries and keys to attention weights.

    `normalized`: rows sum to one (for `rows="clip"`: |row sum| <= 1).
    `output_gate`: the attention layer gates each head's output with a sigmoid.
    """

    @property
    @abc.abstractmethod
    def normalized(self) -> bool: ...

    @property
    def output_gate(self) -> bool:
        return False

    @abc.abstractmethod
    def __call__(self, q: Q, k: K, mask: Mask) -> Weights: ...


class ScoreAttention(AbstractAttention):
    """`A = rows(sigma(s + b))` on the unmasked keys; `b = -log(keys)` if `log_bias`.

    `sigma` is a core normalization applied along the keys, the masked scores set so low
    that sigma gives them weight 0 (then they are zeroed exactly).
    """

    sigma: nz.AbstractNormalization
    rows: Rows = eqx.field(static=True, default="none")
    log_bias: bool = eqx.field(static=True, default=False)
    gate: bool = eqx.field(static=True, default=False)

    @property
    def normalized(self) -> bool:
        return self.rows != "none" or self.sigma.simplex

    @property
    def output_gate(self) -> bool:
        return self.gate

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        s = jnp.einsum("hqd,hkd->hqk", q, k) / jnp.asarray(math.sqrt(q.shape[-1]), q.dtype)
        if self.log_bias:
            s = s - jnp.asarray(math.log(k.shape[-2]), s.dtype)
        a = self.sigma(jnp.where(mask[None], s, jnp.asarray(_MASKED, s.dtype)))
        return _rescale(_zero_masked(a, mask), self.rows)


class KernelAttention(AbstractAttention):
    """`A = rows(phi(q) phi(k)^T * c)`, `c = 1/sqrt(d)` if `scaled` else 1, masked to 0.

    `phi` acts on each head's query and key vectors: `elu + 1` or a small MLP.
    """

    phi: Callable
    scaled: bool = eqx.field(static=True)
    rows: Rows = eqx.field(static=True, default="none")

    @property
    def normalized(self) -> bool:
        return self.rows != "none"

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        fq, fk = self.phi(q), self.phi(k)
        a = jnp.einsum("hqd,hkd->hqk", fq, fk)
        if self.scaled:
            a = a / jnp.asarray(math.sqrt(q.shape[-1]), a.dtype)
        return _rescale(_zero_masked(a, mask), self.rows)


class FeatureMLP(eqx.Module):
    """`phi(x) = W2 gelu(W1 x + b1) + b2` on each head vector, hidden width `4 d`, shared
    by the heads of a layer (the paper's `mlp` attention)."""

    mlp: eqx.nn.MLP

    def __init__(self, dim: int, *, key: PRNGKeyArray):
        self.mlp = eqx.nn.MLP(dim, dim, 4 * dim, 1, activation=_gelu, dtype=jnp.float32, key=key)

    def __call__(self, x: Float[Array, "heads seq dim"]) -> Float[Array, "heads seq dim"]:
        return jax.vmap(jax.vmap(self.mlp))(x)


class UniformAttention(AbstractAttention):
    """`A_ij = 1 / #(unmasked keys of row i)`: attention that cannot choose."""

    @property
    def normalized(self) -> bool:
        return True

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        a = jnp.broadcast_to(mask[None].astype(q.dtype), (q.shape[0],) + mask.shape)
        return _rescale(a, "sum")


def _sink(heads: int, learnable: bool) -> ScoreAttention:
    # a per-head sink logit; as a Python float it is no array leaf, so it does not train
    sink = jnp.zeros((heads, 1, 1), jnp.float32) if learnable else 0.0
    return ScoreAttention(nz.Softmax1(sink=sink))


ATTENTIONS: dict[str, Callable[[int, int, PRNGKeyArray], AbstractAttention]] = {
    "softmax": lambda h, d, key: ScoreAttention(nz.Softmax()),
    "softmax1": lambda h, d, key: _sink(h, False),
    "softmax-sink": lambda h, d, key: _sink(h, True),
    "gated-softmax": lambda h, d, key: ScoreAttention(nz.Softmax(), gate=True),
    "sparsemax": lambda h, d, key: ScoreAttention(nz.Sparsemax()),
    "uniform": lambda h, d, key: UniformAttention(),
    "sigmoid": lambda h, d, key: ScoreAttention(nz.Sigmoid()),
    "sigmoid-norm": lambda h, d, key: ScoreAttention(nz.SigmoidNorm()),
    "sigmoid-bias": lambda h, d, key: ScoreAttention(nz.Sigmoid(), log_bias=True),
    "sigmoid-norm-bias": lambda h, d, key: ScoreAttention(nz.SigmoidNorm(), log_bias=True),
    "elu": lambda h, d, key: ScoreAttention(EluPlusOne()),
    "elu-norm": lambda h, d, key: ScoreAttention(EluPlusOne(), rows="sum"),
    "elu-kernel": lambda h, d, key: KernelAttention(EluPlusOne(), scaled=False),
    "elu-kernel-norm": lambda h, d, key: KernelAttention(EluPlusOne(), scaled=False, rows="sum"),
    "linear": lambda h, d, key: ScoreAttention(nz.Linear()),
    "linear-norm": lambda h, d, key: ScoreAttention(nz.Linear(), rows="clip"),
    "mlp": lambda h, d, key: KernelAttention(FeatureMLP(d, key=key), scaled=True),
    "mlp-norm": lambda h, d, key: KernelAttention(FeatureMLP(d, key=key), scaled=True, rows="clip"),
}


def make_attention(name: str, *, heads: int, head_dim: int, key: PRNGKeyArray) -> AbstractAttention:
    """The attention map registered as `name`, sized for `heads` heads of size `head_dim`
    (`key` initializes the maps with parameters)."""
    return ATTENTIONS[check_choice("norm", name, ATTENTIONS)](heads, head_dim, key)
