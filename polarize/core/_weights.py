"""Attention weights read as a distribution: p = |s| / sum |s|, and its entropy.

Unnormalized maps (sigmoid, relu, linear) are measured on the same scale as softmax,
the convention also used for attention sinks.
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
