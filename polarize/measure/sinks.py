"""Attention-sink metrics for attention maps from any model.

Inputs are arrays `A[..., heads, queries, keys]`, NumPy or JAX; the output is of the same
kind. Unnormalized maps (sigmoid, linear, ...) are accepted: every metric works on the
magnitudes `|A|` and divides by the row mass `sum_j |A_ij|`, except `bos_score`, the
paper's own score, which sums the signed weights as its code does (the same for
nonnegative maps). One zero-mass convention for every metric: a row with zero mass (all
keys masked or all weights zero) has no distribution, so it is left out of every
average over queries, and a head whose rows all have zero mass scores 0.

Causal or bidirectional: `importance` averages `A[i, k]` over the queries that may see
key k, `i >= k`, when the map is causal, and over all queries when any weight lies above
the diagonal (a bidirectional map); `convention(A)` says which applies.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ..core._choices import SINK_EPS


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


def _lead(x, ndim: int):
    """`x[q, k]` shaped for an array of `ndim` axes (explicit: no implicit rank promotion)."""
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


def _upper(attention):
    """True (an array, so it holds under jit) when any weight lies above the diagonal."""
    xp = _xp(attention)
    n_q, n_k = attention.shape[-2:]
    above = _lead(xp.triu(xp.ones((n_q, n_k), dtype=bool), 1), attention.ndim)
    return xp.any(above & (xp.abs(xp.asarray(attention)) > 0))


def convention(attention) -> str:
    """`"causal"` (average over queries `i >= k`) or `"bidirectional"` (all queries)."""
    return "bidirectional" if bool(_upper(attention)) else "causal"


def importance(attention):
    """Gu et al. (ICLR 2025) key importance `alpha_k = mean_i A[i, k]` on renormalized rows,
    shape `[..., heads, keys]`: over queries `i >= k` for a causal map, over all queries
    for a bidirectional one (see `convention`); zero-mass rows left out. Needs square maps."""
    xp = _xp(attention)
    n_q, n_k = attention.shape[-2:]
    if n_q != n_k:
        raise ValueError(f"importance needs square attention maps; got {n_q} x {n_k}")
    seen = _lead(xp.tril(xp.ones((n_q, n_k), dtype=bool)), attention.ndim) | _upper(attention)
    valid = seen & (_mass(attention)[1] > 0)[..., :, None]
    a = renormalize(attention)
    summed = xp.sum(xp.where(valid, a, xp.zeros_like(a)), axis=-2)
    count = xp.sum(valid, axis=-2)
    return summed / xp.maximum(count, 1).astype(a.dtype)


def sink_share(attention, eps: float = SINK_EPS):
    """`Sink_k^eps`: the share of heads with `alpha_k > eps`, shape `[..., keys]`."""
    xp = _xp(attention)
    return xp.mean((importance(attention) > eps).astype(attention.dtype), axis=-2)


def bos_score(attention, start: int = 1, stop: int = -2):
    """The paper's sink score (`rel_attn_bos_global` in tml-epfl/softmax): over the query
    rows `start:stop`, the summed (signed) weight on key 0 over the summed weight of those
    rows, `[..., heads]`. The paper takes rows 1..L-3 (`1:-2`) of each sequence and averages
    this ratio over the sequences; rows of zero mass add nothing, and 0/0 scores 0."""
    xp = _xp(attention)
    rows = xp.asarray(attention)[..., start:stop, :]
    bos = xp.sum(rows[..., 0], axis=-1)
    total = xp.sum(rows, axis=(-2, -1))
    safe = xp.where(total != 0, total, xp.ones_like(total))
    return xp.where(total != 0, bos / safe, xp.zeros_like(total))


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


def head_table(attention, eps: float = SINK_EPS, key: int = 0) -> dict:
    """Per-layer, per-head metrics of maps shaped `[heads, q, k]`, `[layers, heads, q, k]` or
    `[batch, layers, heads, q, k]` (the batch is averaged). Values are `[layers, heads]`
    NumPy arrays: `bos_share`, `sparsity`, `entropy`; for square maps also `alpha`
    (importance of key `key`), `sink` (alpha > eps), `sink_share` `[layers]` = `Sink_key^eps`
    per layer, `sink_share_all` = `Sink_key^eps` over all layers x heads (the number in
    Gu et al.'s tables), and `convention` ("causal" or "bidirectional", see `importance`)."""
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
        if not 0 <= key < a.shape[-1]:
            raise ValueError(f"key must be in 0..{a.shape[-1] - 1}; got {key}")
        alpha = importance(batch)[..., key].mean(0)
        table.update(
            alpha=alpha,
            sink=alpha > eps,
            sink_share=(alpha > eps).mean(-1),
            sink_share_all=float((alpha > eps).mean()),
            convention=convention(batch),
            key=key,
        )
    return table


def format_table(table: dict, eps: float = SINK_EPS) -> str:
    """The table of `head_table` as aligned text, one line per (layer, head), then the
    per-layer and overall `Sink_k^eps`."""
    square = "alpha" in table
    k = table.get("key", 0)
    cols = [c for c in ("bos_share", "sparsity", "entropy") if c in table]
    names = cols + ([f"alpha_{k}"] if square else [])
    header = "layer head " + " ".join(f"{c:>9}" for c in names)
    lines = [header + (f" alpha>{eps}" if square else "")]
    layers, heads = table["bos_share"].shape
    for layer in range(layers):
        for head in range(heads):
            values = [table[c][layer, head] for c in cols] + ([table["alpha"][layer, head]] if square else [])
            row = " ".join(f"{v:9.3f}" for v in values)
            flag = f" {'sink' if table['sink'][layer, head] else '-':>9}" if square else ""
            lines.append(f"{layer:5d} {head:4d} {row}{flag}")
    if square:
        for layer in range(layers):
            lines.append(f"layer {layer}: Sink_{k}^{eps} = {100 * table['sink_share'][layer]:.1f}%")
        count = int(table["sink"].sum())
        lines.append(
            f"all {layers} layers x {heads} heads: Sink_{k}^{eps} = {100 * table['sink_share_all']:.1f}% "
            f"({count} of {layers * heads} heads)"
        )
        where = "queries i >= k" if table["convention"] == "causal" else "all queries"
        lines.append(f"convention: {table['convention']} map, alpha_k averaged over {where}")
    else:
        lines.append("non-square maps: no key importance (alpha) or Sink_k^eps")
    return "\n".join(lines)
