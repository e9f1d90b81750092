"""Attention-sink metrics for attention maps from any model.

Inputs are arrays `A[..., heads, queries, keys]`, NumPy or JAX; the output is of the same
kind. Unnormalized maps (sigmoid, linear, ...) are accepted: every metric works on the
magnitudes `|A|` and divides by the row mass `sum_j |A_ij|`. A row with zero mass (all
keys masked or all weights zero) has no distribution: it is skipped when averaging over
queries, and a head whose rows are all zero scores 0.
"""

import jax
import jax.numpy as jnp
import numpy as np

SINK_EPS = 0.3


def _xp(a):
    return jnp if isinstance(a, jax.Array) else np


def _mass(attention):
    xp = _xp(attention)
    a = xp.abs(xp.asarray(attention))
    return a, xp.sum(a, axis=-1)


def _mean_rows(xp, values, total):
    """Mean over the query axis of `values[..., q]`, skipping rows with zero mass."""
    valid = total > 0
    count = xp.sum(valid, axis=-1)
    summed = xp.sum(xp.where(valid, values, xp.zeros_like(values)), axis=-1)
    return summed / xp.maximum(count, 1)


def renormalize(attention):
    """`|A_ij| / sum_j' |A_ij'|` per row; rows with zero mass stay zero."""
    xp = _xp(attention)
    a, total = _mass(attention)
    safe = xp.where(total > 0, total, xp.ones_like(total))
    return a / safe[..., None]


def importance(attention):
    """Gu et al. (ICLR 2025) key importance `alpha_k = mean_{i >= k} A[i, k]` on renormalized
    rows, shape `[..., heads, keys]`. Needs square maps (queries = keys)."""
    xp = _xp(attention)
    n_q, n_k = attention.shape[-2:]
    if n_q != n_k:
        raise ValueError(f"importance needs square attention maps; got {n_q} x {n_k}")
    below = xp.tril(xp.ones((n_q, n_k), dtype=bool))
    a = renormalize(attention)
    summed = xp.sum(xp.where(below, a, xp.zeros_like(a)), axis=-2)
    count = xp.arange(n_k, 0, -1).astype(a.dtype)
    return summed / count.reshape((1,) * (summed.ndim - 1) + (n_k,))


def sink_share(attention, eps: float = SINK_EPS):
    """`Sink_k^eps`: the share of heads with `alpha_k > eps`, shape `[..., keys]`."""
    xp = _xp(attention)
    return xp.mean((importance(attention) > eps).astype(attention.dtype), axis=-2)


def bos_share(attention):
    """Mass on key 0 over total mass per row, averaged over queries: `[..., heads]`."""
    xp = _xp(attention)
    a, total = _mass(attention)
    safe = xp.where(total > 0, total, xp.ones_like(total))
    return _mean_rows(xp, a[..., 0] / safe, total)


def sparsity(attention):
    """`max_j |A_ij| / sum_j |A_ij|` averaged over queries: `[..., heads]` (1 = one key)."""
    xp = _xp(attention)
    a, total = _mass(attention)
    safe = xp.where(total > 0, total, xp.ones_like(total))
    return _mean_rows(xp, xp.max(a, axis=-1) / safe, total)


def row_entropy(attention):
    """Shannon entropy (nats) of each renormalized row: `[..., heads, queries]`; 0 log 0 = 0."""
    xp = _xp(attention)
    p = renormalize(attention)
    logp = xp.log(xp.where(p > 0, p, xp.ones_like(p)))
    return -xp.sum(p * logp, axis=-1)


def mean_entropy(attention):
    """Row entropy averaged over queries (zero-mass rows skipped): `[..., heads]`."""
    xp = _xp(attention)
    return _mean_rows(xp, row_entropy(attention), _mass(attention)[1])


def massive_activations(hidden, threshold: float = 100.0, ratio: float = 1000.0):
    """Sun et al. (2024) massive activations: `|x| > threshold` and `|x| > ratio * median|x|`,
    the median taken over the whole array given (one layer's hidden states). Boolean mask."""
    xp = _xp(hidden)
    a = xp.abs(xp.asarray(hidden))
    return (a > threshold) & (a > ratio * xp.median(a))


def head_table(attention, eps: float = SINK_EPS) -> dict:
    """Per-layer, per-head metrics of maps shaped `[heads, q, k]`, `[layers, heads, q, k]` or
    `[batch, layers, heads, q, k]` (the batch is averaged). Values are `[layers, heads]`
    NumPy arrays: `bos_share`, `sparsity`, `entropy`, `alpha0` (importance of key 0),
    `sink` (alpha0 > eps); `sink_share` is `[layers]` = `Sink_0^eps` per layer."""
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim == 3:
        a = a[None]
    if a.ndim not in (4, 5):
        raise ValueError(
            f"attention must be [heads, q, k], [layers, heads, q, k] or "
            f"[batch, layers, heads, q, k]; got shape {a.shape}"
        )
    batch = a if a.ndim == 5 else a[None]
    table = {
        "bos_share": bos_share(batch).mean(0),
        "sparsity": sparsity(batch).mean(0),
        "entropy": mean_entropy(batch).mean(0),
    }
    if a.shape[-1] == a.shape[-2]:
        alpha0 = importance(batch)[..., 0].mean(0)
        table["alpha0"] = alpha0
        table["sink"] = alpha0 > eps
        table["sink_share"] = (alpha0 > eps).mean(-1)
    return table


def format_table(table: dict, eps: float = SINK_EPS) -> str:
    """The table of `head_table` as aligned text, one line per (layer, head)."""
    cols = [c for c in ("bos_share", "sparsity", "entropy", "alpha0") if c in table]
    header = "layer head " + " ".join(f"{c:>9}" for c in cols)
    lines = [header + (f" sink>{eps}" if "sink" in table else "")]
    layers, heads = table["bos_share"].shape
    for layer in range(layers):
        for head in range(heads):
            row = " ".join(f"{table[c][layer, head]:9.3f}" for c in cols)
            flag = f" {'yes' if table['sink'][layer, head] else 'no':>8}" if "sink" in table else ""
            lines.append(f"{layer:5d} {head:4d} {row}{flag}")
        if "sink_share" in table:
            lines.append(f"layer {layer}: Sink_0^{eps} = {table['sink_share'][layer]:.3f}")
    return "\n".join(lines)
