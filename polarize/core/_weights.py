"""Attention weights read as a distribution: p = |s| / sum |s|, its max weight and entropy.

Unnormalized maps (sigmoid, relu, linear) are measured on the same scale as softmax,
the convention also used for attention sinks. A model with one weight vector per
sample (prompt attention: weights (..., samples, tokens)) is as polarized as its least
polarized sample: its max weight is the minimum over samples of max_t p_t, its entropy
the maximum over samples.
"""

import jax.numpy as jnp
from jaxtyping import Array, Float


def distribution(weights: Float[Array, "... tokens"]) -> Float[Array, "... tokens"]:
    """p = |s| / sum |s| along the last axis (uniform where s = 0)."""
    mass = jnp.abs(weights)
    total = jnp.sum(mass, axis=-1, keepdims=True)
    zero = total == 0
    return jnp.where(zero, 1.0 / weights.shape[-1], mass / jnp.where(zero, 1.0, total))


def entropy(p: Float[Array, "... tokens"]) -> Float[Array, "..."]:
    """H(p) = -sum p log p, with 0 log 0 = 0 (natural log)."""
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)


def max_weight(weights: Float[Array, "... tokens"], ndim: int | None = None) -> Float[Array, "..."]:
    """max_t p_t, reduced to the first `ndim` axes (None: no reduction) by the minimum over
    the others: the samples of prompt attention, whose least polarized sample counts."""
    return _over_samples(jnp.max(distribution(weights), axis=-1), ndim, jnp.min)


def max_entropy(weights: Float[Array, "... tokens"], ndim: int | None = None) -> Float[Array, "..."]:
    """H(p), reduced to the first `ndim` axes by the maximum over the others (see `max_weight`)."""
    return _over_samples(entropy(distribution(weights)), ndim, jnp.max)


def _over_samples(x, ndim, reduce):
    if ndim is None or x.ndim == ndim:
        return x
    return reduce(x, axis=tuple(range(ndim, x.ndim)))
