"""Which tokens a prompt-attention flow selects, and how close p is to their attention SVM.

Per initialization of a `PromptAttention` trajectory: the token each sample selects at
the last saved time (argmax of sigma(X_i p)), whether it is the best-score token
(argmax_t y_i v^T x_{i,t}), the cosine of p(t) with the attention SVM of that selection
and with the SVM of the best-score selection (the global one of Tarzanagh et al.), |p(t)|
and its slope against log t, and for joint training the cosine of v(t) with the value SVM.
Computed on the host (the SVMs come from `polarize.measure._svm`), not under `jax.jit`.

For sweeps also: `weight_statistics`, the polarization of a prompt-attention trajectory
read through its least polarized sample (max weight: the minimum over samples of
max_t p_t; entropy: the maximum over samples), the reading its hitting times use
(`core._weights.max_weight`); and `aggregate_selection`, the ensemble numbers of the
token selection.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ..core._batching import blockwise
from ..core._errors import PolarizeError
from ..core._prompt import PromptAttention
from ..core._weights import max_entropy, max_weight
from ._statistics import masked
from ._svm import attention_svm, best_tokens, value_svm


@dataclasses.dataclass(frozen=True)
class TokenSelection:
    """Token-selection statistics of a prompt-attention trajectory, per initialization.

    Arrays have a leading inits axis (none for a single initialization); `times` axes
    follow the trajectory's saved times `ts`.

    - `selected`, `best` (samples,): the selected and the best-score token of each sample;
      `is_best` where they agree, `all_best` when they do for every sample;
    - `feasible`: the selection has an attention SVM; `svm_norm` its |p_mm| (inf if not);
    - `cos_selected`, `cos_best` (times,): cosine of p(t) with the SVM of the selection and
      with that of the best-score selection (NaN where that one is infeasible);
    - `norm` (times,): |p(t)|; `log_slope`: the least-squares slope of |p| against log t
      over the last third of the saved log t range (it tends to |p_mm| when p aligns);
    - `cos_value` (times,): cosine of v(t) with the value SVM of the selection
      (NaN for `train="p"` or where the value SVM is infeasible);
    - `ok`: the trajectory's `ok`; a failed initialization has `selected = -1`, NaN
      cosines, norms and slope, and `feasible = False`.
    """

    ts: np.ndarray
    ok: np.ndarray
    selected: np.ndarray
    best: np.ndarray
    is_best: np.ndarray
    all_best: np.ndarray
    feasible: np.ndarray
    svm_norm: np.ndarray
    cos_selected: np.ndarray
    cos_best: np.ndarray
    norm: np.ndarray
    log_slope: np.ndarray
    cos_value: np.ndarray

    def final(self) -> dict[str, np.ndarray]:
        """One number per initialization: the statistics at the last saved time."""
        return {
            "ok": self.ok,
            "all_best": self.all_best,
            "share_best": self.is_best.mean(axis=-1),
            "feasible": self.feasible,
            "svm_norm": self.svm_norm,
            "cos_selected": self.cos_selected[..., -1],
            "cos_best": self.cos_best[..., -1],
            "norm": self.norm[..., -1],
            "log_slope": self.log_slope,
            "cos_value": self.cos_value[..., -1],
        }


def _cosine(x, d):
    """cos(x(t), d) along the last axis: x (inits, times, dim), d (inits, dim)."""
    dots = np.einsum("ktd,kd->kt", x, d)
    with np.errstate(invalid="ignore", divide="ignore"):
        return dots / (np.linalg.norm(x, axis=-1) * np.linalg.norm(d, axis=-1)[:, None])


def log_slope(ts, norm) -> np.ndarray:
    """The least-squares slope of `norm` (inits, times) against log t over the last third
    of the saved log t range (times t >= 1 only)."""
    ts = np.asarray(ts, np.float64)
    use = ts >= 1.0
    if use.sum() < 2:
        raise PolarizeError("the log-t slope needs at least two saved times t >= 1")
    logt = np.log(ts[use])
    last = logt >= logt[-1] - (logt[-1] - logt[0]) / 3
    if last.sum() < 2:
        last = np.arange(len(logt)) >= len(logt) - 2
    x = logt[last] - logt[last].mean()
    y = np.asarray(norm)[:, use][:, last]
    return (y - y.mean(axis=-1, keepdims=True)) @ x / (x @ x)


def token_selection(traj, model, y) -> TokenSelection:
    """The token-selection statistics of a `PromptAttention` trajectory (see `TokenSelection`).

    Args:
        traj: the `Trajectory` of `flow` or `descend` on `model`.
        model: the `PromptAttention` model it started from (for X and the training mode).
        y: the labels (samples,), or the objective that holds them (`.y`).
    """
    if not isinstance(model, PromptAttention):
        raise PolarizeError(f"`token_selection` needs a PromptAttention model; got {type(model).__name__}")
    y = np.asarray(getattr(y, "y", y), np.float64)
    X = np.asarray(model.X, np.float64)
    single = not traj.batched
    p, v, w = (np.asarray(x, np.float64) for x in (traj.p, traj.v, traj.weights))
    ok = np.asarray(traj.ok).reshape(-1)
    if single:
        p, v, w = p[None], v[None], w[None]
    # a failed initialization is measured at its start (finite), then masked below
    p, v = np.where(ok[:, None, None], p, p[:, :1]), np.where(ok[:, None, None], v, v[:, :1])
    w = np.where(ok[:, None, None, None], w, 0.0)
    selected = np.argmax(w[:, -1], axis=-1)  # (inits, samples)
    best = best_tokens(X, y, v[:, -1])
    ours = _unique_svms(attention_svm, X, selected)
    theirs = _unique_svms(attention_svm, X, best)
    if model.train == "vp":
        value = _unique_svms(lambda X, s: value_svm(X, y, s), X, selected)
        cos_value = _cosine(v, value.direction)
    else:
        cos_value = np.full(p.shape[:2], np.nan)
    norm = np.linalg.norm(p, axis=-1)
    is_best = (selected == best) & ok[:, None]
    failed = lambda x, fill=np.nan: np.where(ok.reshape((-1,) + (1,) * (x.ndim - 1)), x, fill)
    out = TokenSelection(
        ts=np.asarray(traj.ts),
        ok=ok,
        selected=failed(selected, -1),
        best=best,
        is_best=is_best,
        all_best=is_best.all(axis=-1),
        feasible=ours.feasible & ok,
        svm_norm=failed(ours.norm),
        cos_selected=failed(_cosine(p, ours.direction)),
        cos_best=failed(_cosine(p, theirs.direction)),
        norm=failed(norm),
        log_slope=failed(log_slope(traj.ts, norm)),
        cos_value=failed(cos_value),
    )
    if single:
        out = dataclasses.replace(out, **{f.name: getattr(out, f.name)[0] for f in _PER_INIT})
    return out


_PER_INIT = [f for f in dataclasses.fields(TokenSelection) if f.name != "ts"]


def _unique_svms(solve, X, selections):
    """`solve(X, selections)` for a batch (inits, samples), each distinct selection solved once."""
    unique, inverse = np.unique(selections, axis=0, return_inverse=True)
    result = solve(X, unique)
    return type(result)(*(x[inverse.reshape(-1)] for x in result))


def weight_statistics(traj, *, keep=None) -> dict:
    """Per initialization of a batched prompt-attention trajectory: `final_max_weight` (the
    minimum over samples of max_t p_t, p = |s| / sum |s|: the least polarized sample),
    `final_entropy` (the maximum over samples of H(p)) and `final_loss` at the last saved
    time; with `keep` (indices of saved times), `snap_max_weight` and `snap_entropy` there
    (float32). NaN where `ok` is False. Per initialization in fixed blocks, so the numbers
    never depend on the rest of the batch."""
    keep = None if keep is None else tuple(int(k) for k in np.asarray(keep).reshape(-1))  # static
    return _weights_by_block(traj.weights, traj.loss, traj.ok, keep)


@eqx.filter_jit
def _weights_by_block(weights, loss, ok, keep):
    def one(arrays):
        weights, loss, ok = arrays
        weights, loss = jnp.where(ok, weights, 0.0), jnp.where(ok, loss, 0.0)  # finite stand-ins
        top, H = max_weight(weights, 1), max_entropy(weights, 1)  # (times,)
        out = {"final_max_weight": top[-1], "final_entropy": H[-1], "final_loss": loss[-1]}
        if keep is not None:
            out["snap_max_weight"] = top[np.asarray(keep)].astype(jnp.float32)
            out["snap_entropy"] = H[np.asarray(keep)].astype(jnp.float32)
        return {k: masked(v, ok) for k, v in out.items()}

    return blockwise(one, (weights, loss, ok))


def aggregate_selection(final: dict) -> dict:
    """Ensemble numbers of the token selection from per-initialization values (the names of
    `TokenSelection.final()`, with `selected` (inits, samples)), over the initializations
    that did not fail (`ok`); a median over those where the value is defined (finite),
    None where there is none.

    `share_global_selection`: the fraction with `all_best`; `n_selections`: the distinct
    selections; `n_infeasible`: those whose selection has no attention SVM;
    `median_one_minus_cos_selected`, `median_one_minus_cos_best`: of 1 - cos(p, p_mm) with
    the SVM of the selection and of the best-score one; `median_slope_over_svm_norm`: of
    the log-t slope of |p| over |p_mm|, over the feasible; `median_cos_value`: of
    cos(v, v_mm) (joint training).
    """
    ok = np.asarray(final["ok"], bool)

    def median(x, where=ok):
        x = np.asarray(x, np.float64)[where]
        x = x[np.isfinite(x)]
        return float(np.median(x)) if x.size else None

    feasible = ok & np.asarray(final["feasible"], bool)
    return {
        "share_global_selection": float(np.mean(np.asarray(final["all_best"])[ok])) if ok.any() else None,
        "n_selections": int(len(np.unique(np.asarray(final["selected"])[ok], axis=0))),
        "n_infeasible": int(np.sum(ok & ~feasible)),
        "median_one_minus_cos_selected": median(1.0 - np.asarray(final["cos_selected"], np.float64)),
        "median_one_minus_cos_best": median(1.0 - np.asarray(final["cos_best"], np.float64)),
        "median_slope_over_svm_norm": median(
            np.asarray(final["log_slope"], np.float64) / np.asarray(final["svm_norm"], np.float64),
            feasible,
        ),
        "median_cos_value": median(final["cos_value"]),
    }
