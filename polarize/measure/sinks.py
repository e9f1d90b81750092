"""Attention-sink metrics for attention maps from any model.

Inputs are arrays `A[..., heads, queries, keys]`, NumPy or JAX; the output is of the same
kind. Every metric reads the rows through one normalization, `mass` (`MASSES`):

- `"abs"` (the default): `p_ij = |A_ij| / sum_j' |A_ij'|`; for softmax rows this is `A`
  itself, and signed or unnormalized maps (sigmoid, linear) are scored by magnitude.
- `"positive"`: `p_ij = max(A_ij, 0) / sum_j' max(A_ij', 0)`; negative similarities count
  as no attention.
- `"raw"`: `p_ij = A_ij` as given, no division: rows that do not sum to 1 (softmax1 with
  its null mass, sigmoid) keep their total, signed weights their sign; the entropy then
  sums `-p log p` over the positive weights only.

`bos_score`, the paper's own score, always sums the signed weights as its code does.
One zero-mass convention for every metric: a row whose mass is zero (`sum_j |A_ij| = 0`,
or `sum_j max(A_ij, 0) = 0` for `"positive"`: all keys masked or all weights zero) has no
distribution, so it is left out of every average over queries, and a head whose rows all
have zero mass scores 0. A NaN or inf weight is never dropped: its row's metrics are NaN,
and `head_table` reports the head as `"nonfinite"` instead of averaging it in.

Causal or bidirectional: `importance` averages `p[i, k]` over the queries that may see
key k, `i >= k`, when the map is causal, and over all queries when any weight lies above
the diagonal (a bidirectional map); `convention(A)` says which applies.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ..core._choices import SINK_EPS, SINK_MASS, SINK_MASSES
from ..core._errors import check_choice

MASSES = SINK_MASSES


def _xp(a):
    return jnp if isinstance(a, jax.Array) else np


def _rows(attention, mass: str = SINK_MASS):
    """`(p, valid)`: the weights `p[..., q, k]` under `mass` and the rows `valid[..., q]`
    that have a distribution (nonzero mass; a NaN mass counts as valid, so it shows)."""
    check_choice("mass", mass, MASSES)
    xp = _xp(attention)
    a = xp.asarray(attention)
    w = xp.maximum(a, xp.zeros_like(a)) if mass == "positive" else xp.abs(a)
    total = xp.sum(w, axis=-1)
    valid = ~(total == 0)
    if mass == "raw":
        return a, valid
    safe = xp.where(valid, total, xp.ones_like(total))
    # an inf weight makes its row inf / inf = NaN: the head is reported nonfinite, so
    # NumPy's warning about it says nothing more
    with np.errstate(invalid="ignore"):
        return w / safe[..., None], valid


def _mean_rows(xp, values, valid):
    """Mean over the query axis of `values[..., q]`, over the `valid` rows only."""
    count = xp.sum(valid, axis=-1)
    summed = xp.sum(xp.where(valid, values, xp.zeros_like(values)), axis=-1)
    return summed / xp.maximum(count, 1)


def renormalize(attention, mass: str = SINK_MASS):
    """The weights `p_ij` under `mass` (`|A_ij| / sum_j' |A_ij'|` by default); rows with
    zero mass stay zero."""
    xp = _xp(attention)
    p, valid = _rows(attention, mass)
    return xp.where(valid[..., None], p, xp.zeros_like(p))


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


def importance(attention, mass: str = SINK_MASS):
    """Gu et al. (ICLR 2025) key importance `alpha_k = mean_i p[i, k]` (`p` the rows under
    `mass`), shape `[..., heads, keys]`: over queries `i >= k` for a causal map, over all
    queries for a bidirectional one (see `convention`); zero-mass rows left out. Needs
    square maps."""
    xp = _xp(attention)
    n_q, n_k = attention.shape[-2:]
    if n_q != n_k:
        raise ValueError(f"importance needs square attention maps; got {n_q} x {n_k}")
    p, rows = _rows(attention, mass)
    seen = _lead(xp.tril(xp.ones((n_q, n_k), dtype=bool)), attention.ndim) | _upper(attention)
    valid = seen & rows[..., :, None]
    summed = xp.sum(xp.where(valid, p, xp.zeros_like(p)), axis=-2)
    count = xp.sum(valid, axis=-2)
    return summed / xp.maximum(count, 1).astype(p.dtype)


def sink_share(attention, eps: float = SINK_EPS, mass: str = SINK_MASS):
    """`Sink_k^eps`: the share of heads with `alpha_k > eps`, shape `[..., keys]`."""
    xp = _xp(attention)
    return xp.mean((importance(attention, mass) > eps).astype(attention.dtype), axis=-2)


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


def bos_share(attention, mass: str = SINK_MASS):
    """Weight on key 0 per row, `p[i, 0]`, averaged over queries: `[..., heads]`."""
    xp = _xp(attention)
    p, valid = _rows(attention, mass)
    return _mean_rows(xp, p[..., 0], valid)


def sparsity(attention, mass: str = SINK_MASS):
    """`max_j p_ij` averaged over queries: `[..., heads]` (1 = one key; with `"abs"`,
    `max_j |A_ij| / sum_j |A_ij|`)."""
    xp = _xp(attention)
    p, valid = _rows(attention, mass)
    return _mean_rows(xp, xp.max(p, axis=-1), valid)


def row_entropy(attention, mass: str = SINK_MASS):
    """Shannon entropy (nats) `-sum_j p_ij log p_ij` of each row, over `p_ij > 0`:
    `[..., heads, queries]`; 0 log 0 = 0."""
    xp = _xp(attention)
    p = renormalize(attention, mass)
    logp = xp.log(xp.where(p > 0, p, xp.ones_like(p)))
    return -xp.sum(xp.where(p < 0, xp.zeros_like(p), p) * logp, axis=-1)


def mean_entropy(attention, mass: str = SINK_MASS):
    """Row entropy averaged over queries (zero-mass rows skipped): `[..., heads]`."""
    xp = _xp(attention)
    return _mean_rows(xp, row_entropy(attention, mass), _rows(attention, mass)[1])


def massive_activations(hidden, threshold: float = 100.0, ratio: float = 1000.0):
    """Sun et al. (2024) massive activations: `|x| > threshold` and `|x| > ratio * median|x|`,
    the median taken over the whole array given (one layer's hidden states). Boolean mask."""
    xp = _xp(hidden)
    a = xp.abs(xp.asarray(hidden))
    return (a > threshold) & (a > ratio * xp.median(a))


def head_metrics(attention, key: int = 0, mass: str = SINK_MASS) -> dict:
    """Per-head metrics of maps `[..., heads, q, k]` as NumPy float64 arrays `[..., heads]`:
    `bos_share`, `sparsity`, `entropy`, `nonfinite` (the number of NaN or inf weights), and
    for square maps `alpha` (importance of key `key`) and `bidirectional` (one bool for
    the whole array, see `convention`). The streamed path of `polarize sinks --model` calls
    it on one head of one layer at a time, `head_table` on the whole array: the same numbers."""
    a = np.asarray(attention, dtype=np.float64)
    metrics = {
        "bos_share": bos_share(a, mass),
        "sparsity": sparsity(a, mass),
        "entropy": mean_entropy(a, mass),
        "nonfinite": np.sum(~np.isfinite(a), axis=(-2, -1)),
    }
    if a.shape[-1] == a.shape[-2]:
        if not 0 <= key < a.shape[-1]:
            raise ValueError(f"key must be in 0..{a.shape[-1] - 1}; got {key}")
        metrics.update(alpha=importance(a, mass)[..., key], bidirectional=bool(_upper(a)))
    return metrics


def summarize_heads(metrics: dict, eps: float = SINK_EPS, key: int = 0, mass: str = SINK_MASS) -> dict:
    """The table of `head_table` from per-sequence metrics `[batch, layers, heads]` (as
    `head_metrics` returns them, stacked): each metric averaged over the batch. A head with
    any NaN or inf weight has status `"nonfinite"`, NaN metrics and no sink flag, and is
    left out of `Sink_k^eps`, which is the share of sinks among the finite heads (NaN when
    none is finite); `nonfinite` counts those heads."""
    bad = np.sum(metrics["nonfinite"], axis=0) > 0
    nan = np.full(bad.shape, np.nan)
    table = {
        name: np.where(bad, nan, np.mean(metrics[name], axis=0))
        for name in ("bos_share", "sparsity", "entropy", "alpha")
        if name in metrics
    }
    table.update(mass=mass, finite=~bad, nonfinite=int(bad.sum()))
    if "alpha" in table:
        sink = np.where(bad, False, table["alpha"] > eps)
        finite_per_layer = (~bad).sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_layer = sink.sum(-1) / finite_per_layer
        table.update(
            sink=sink,
            sink_share=np.where(finite_per_layer > 0, per_layer, np.nan),
            sink_share_all=float(sink.sum() / (~bad).sum()) if (~bad).any() else float("nan"),
            convention="bidirectional" if np.any(metrics["bidirectional"]) else "causal",
            key=key,
        )
    return table


def head_table(attention, eps: float = SINK_EPS, key: int = 0, mass: str = SINK_MASS) -> dict:
    """Per-layer, per-head metrics of maps shaped `[heads, q, k]`, `[layers, heads, q, k]` or
    `[batch, layers, heads, q, k]` (the batch is averaged). Values are `[layers, heads]`
    NumPy arrays: `bos_share`, `sparsity`, `entropy`, `finite`; for square maps also
    `alpha` (importance of key `key`), `sink` (alpha > eps), `sink_share` `[layers]` =
    `Sink_key^eps` per layer, `sink_share_all` = `Sink_key^eps` over all layers x heads (the
    number in Gu et al.'s tables), and `convention` ("causal" or "bidirectional", see
    `importance`); `nonfinite` counts the heads with NaN or inf weights (`summarize_heads`)."""
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim == 3:
        a = a[None]
    if a.ndim not in (4, 5):
        raise ValueError(
            f"attention must be [heads, q, k], [layers, heads, q, k] or "
            f"[batch, layers, heads, q, k]; got shape {a.shape}"
        )
    batch = a if a.ndim == 5 else a[None]
    metrics = head_metrics(batch, key=key, mass=mass)
    if "bidirectional" in metrics:
        metrics["bidirectional"] = np.array([metrics["bidirectional"]])
    return summarize_heads(metrics, eps=eps, key=key, mass=mass)


def _percent(share: float) -> str:
    return "n/a" if share != share else f"{100 * share:.1f}%"


def format_table(table: dict, eps: float = SINK_EPS) -> str:
    """The table of `head_table` as aligned text, one line per (layer, head), then the
    per-layer and overall `Sink_k^eps`; a head with NaN or inf weights is flagged
    `nonfinite` and counted apart."""
    square = "alpha" in table
    k = table.get("key", 0)
    cols = [c for c in ("bos_share", "sparsity", "entropy") if c in table]
    names = cols + ([f"alpha_{k}"] if square else [])
    header = "layer head " + " ".join(f"{c:>9}" for c in names)
    lines = [header + (f" alpha>{eps}" if square else "")]
    layers, heads = table["bos_share"].shape
    finite = table.get("finite", np.ones((layers, heads), dtype=bool))
    for layer in range(layers):
        for head in range(heads):
            values = [table[c][layer, head] for c in cols] + ([table["alpha"][layer, head]] if square else [])
            row = " ".join(f"{v:9.3f}" for v in values)
            sink = square and table["sink"][layer, head]
            status = "nonfinite" if not finite[layer, head] else ("sink" if sink else "-")
            flag = f" {status:>9}" if square or status == "nonfinite" else ""
            lines.append(f"{layer:5d} {head:4d} {row}{flag}")
    if square:
        for layer in range(layers):
            bad = int((~finite[layer]).sum())
            note = f" ({bad} of {heads} heads nonfinite, left out)" if bad else ""
            lines.append(f"layer {layer}: Sink_{k}^{eps} = {_percent(table['sink_share'][layer])}{note}")
        count = int(table["sink"].sum())
        bad = int((~finite).sum())
        n = layers * heads
        of = f"{count} of {n - bad} finite heads; {bad} nonfinite" if bad else f"{count} of {n} heads"
        share = _percent(table["sink_share_all"])
        lines.append(f"all {layers} layers x {heads} heads: Sink_{k}^{eps} = {share} ({of})")
        where = "queries i >= k" if table["convention"] == "causal" else "all queries"
        lines.append(f"convention: {table['convention']} map, alpha_k averaged over {where}")
    else:
        lines.append("non-square maps: no key importance (alpha) or Sink_k^eps")
    if table.get("mass", SINK_MASS) != SINK_MASS:
        lines.append(f"mass: {table['mass']}")
    return "\n".join(lines)
