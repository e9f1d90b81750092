"""Attention normalizations: weights `A[h, i, j]` from queries and keys under a mask.

Every normalization maps `q: [heads, queries, d]`, `k: [heads, keys, d]` and a boolean
`mask: [queries, keys]` (True = may attend) to weights `[heads, queries, keys]` that are
exactly zero where the mask is False. Scores are `s = q k^T / sqrt(d)` unless stated.
Strings become objects only through `make_normalization(name, heads)`.
"""

import abc
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ..errors import check_choice

Q = Float[Array, "heads queries dim"]
K = Float[Array, "heads keys dim"]
Mask = Bool[Array, "queries keys"]
Weights = Float[Array, "heads queries keys"]


def _scores(q: Q, k: K) -> Weights:
    return jnp.einsum("hqd,hkd->hqk", q, k) / jnp.asarray(math.sqrt(q.shape[-1]), q.dtype)


def _zero_masked(a: Weights, mask: Mask) -> Weights:
    return jnp.where(mask[None], a, jnp.zeros((), a.dtype))


class AbstractNormalization(eqx.Module):
    """Maps queries and keys to attention weights.

    `normalized`: a row-normalized variant (rows sum to one; for `Linear`, |row sum| <= 1).
    `output_gate`: the attention layer gates each head's output with a sigmoid.
    """

    normalized: eqx.AbstractClassVar[bool]
    output_gate: eqx.AbstractClassVar[bool]

    @abc.abstractmethod
    def __call__(self, q: Q, k: K, mask: Mask) -> Weights: ...


class Softmax(AbstractNormalization):
    """`A_ij = exp(s_ij) / sum_j' exp(s_ij')` over unmasked keys."""

    normalized = True
    output_gate = False

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        return jax.nn.softmax(_scores(q, k), axis=-1, where=mask[None])


class GatedSoftmax(Softmax):
    """Softmax weights; the attention layer multiplies each head's output by a sigmoid gate."""

    output_gate = True


class SoftmaxSink(AbstractNormalization):
    """`A_ij = exp(s_ij) / (exp(b_h) + sum_j' exp(s_ij'))`: a sink logit per head.

    `b = 0` fixed is softmax1 ("off-by-one"); with `learnable` the logits train.
    """

    logit: Float[Array, " heads"]
    learnable: bool = eqx.field(static=True)
    normalized = False
    output_gate = False

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        b = self.logit if self.learnable else jax.lax.stop_gradient(self.logit)
        s = jnp.where(mask[None], _scores(q, k), -jnp.inf)
        b = jnp.broadcast_to(b[:, None, None], s.shape[:-1] + (1,)).astype(s.dtype)
        m = jnp.maximum(jnp.max(s, axis=-1, keepdims=True), b)
        e = jnp.exp(s - m)
        return e / (jnp.exp(b - m) + jnp.sum(e, axis=-1, keepdims=True))


class Sigmoid(AbstractNormalization):
    """`A_ij = sigmoid(s_ij + b)`, `b = -log n` (n = number of keys) if `bias`, else 0;
    divided by the row sum if `normalize`."""

    normalize: bool = eqx.field(static=True)
    bias: bool = eqx.field(static=True)
    output_gate = False

    @property
    def normalized(self) -> bool:  # type: ignore[override]
        return self.normalize

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        s = _scores(q, k)
        if self.bias:
            s = s - jnp.asarray(math.log(k.shape[-2]), s.dtype)
        a = _zero_masked(jax.nn.sigmoid(s), mask)
        if self.normalize:
            a = a / jnp.sum(a, axis=-1, keepdims=True)
        return a


class EluKernel(AbstractNormalization):
    """Linear attention with feature map `phi = elu + 1`: `A_ij = phi(q_i).phi(k_j) / sqrt(d)`,
    or divided by the row sum if `normalize` (then the `sqrt(d)` cancels)."""

    normalize: bool = eqx.field(static=True)
    output_gate = False

    @property
    def normalized(self) -> bool:  # type: ignore[override]
        return self.normalize

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        a = _zero_masked(_scores(jax.nn.elu(q) + 1, jax.nn.elu(k) + 1), mask)
        if self.normalize:
            a = a / jnp.sum(a, axis=-1, keepdims=True)
        return a


class Linear(AbstractNormalization):
    """Raw scores `A_ij = s_ij`, or `s_ij / max(|sum_j' s_ij'|, 1)` if `normalize`."""

    normalize: bool = eqx.field(static=True)
    output_gate = False

    @property
    def normalized(self) -> bool:  # type: ignore[override]
        return self.normalize

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        a = _zero_masked(_scores(q, k), mask)
        if self.normalize:
            total = jnp.abs(jnp.sum(a, axis=-1, keepdims=True))
            a = a / jnp.maximum(total, jnp.ones((), a.dtype))
        return a


class Sparsemax(AbstractNormalization):
    """Euclidean projection of each score row onto the simplex (Martins & Astudillo 2016):
    `A_ij = max(s_ij - tau_i, 0)` with `tau_i` chosen so the row sums to one."""

    normalized = True
    output_gate = False

    def __call__(self, q: Q, k: K, mask: Mask) -> Weights:
        s = _scores(q, k)
        low = jnp.asarray(-1e9, s.dtype)  # finite so that k * z stays finite below
        z = jnp.where(mask[None], s, low)
        zs = -jnp.sort(-z, axis=-1)
        cs = jnp.cumsum(zs, axis=-1)
        r = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
        r = jnp.broadcast_to(r, z.shape)
        support = (1 + r * zs > cs) & (zs > low)
        size = jnp.sum(support, axis=-1, keepdims=True)
        total = jnp.take_along_axis(cs, size - 1, axis=-1)
        tau = (total - 1) / size.astype(z.dtype)
        return _zero_masked(jnp.maximum(z - tau, jnp.zeros((), z.dtype)), mask)


def _sink(heads: int, learnable: bool) -> SoftmaxSink:
    return SoftmaxSink(jnp.zeros((heads,), jnp.float32), learnable)


NORMALIZATIONS = {
    "softmax": lambda h: Softmax(),
    "softmax1": lambda h: _sink(h, False),
    "softmax-sink": lambda h: _sink(h, True),
    "gated-softmax": lambda h: GatedSoftmax(),
    "sparsemax": lambda h: Sparsemax(),
    "sigmoid": lambda h: Sigmoid(normalize=False, bias=False),
    "sigmoid-bias": lambda h: Sigmoid(normalize=False, bias=True),
    "sigmoid-norm": lambda h: Sigmoid(normalize=True, bias=False),
    "sigmoid-norm-bias": lambda h: Sigmoid(normalize=True, bias=True),
    "elu": lambda h: EluKernel(normalize=False),
    "elu-norm": lambda h: EluKernel(normalize=True),
    "linear": lambda h: Linear(normalize=False),
    "linear-norm": lambda h: Linear(normalize=True),
}


def make_normalization(name: str, heads: int) -> AbstractNormalization:
    """The normalization registered as `name`, sized for `heads` heads where it has parameters."""
    return NORMALIZATIONS[check_choice("norm", name, NORMALIZATIONS)](heads)
