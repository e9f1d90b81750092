"""Polarization statistics of a trajectory, per initialization and over the ensemble.

Weights are read as an attention distribution p = |s| / sum |s| (uniform when
s = 0), so unnormalized maps (sigmoid, relu, linear) are measured on the same
scale as softmax, the convention also used for attention sinks.
"""

import dataclasses

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..core._batching import blockwise, exact_matmuls
from ..core._errors import PolarizeError
from ..core._objectives import AbstractObjective
from ..core._quantile import quantile
from ..core._trajectory import Trajectory, ValuePath
from ..core._weights import distribution, entropy
from ..core.status import counts

#: Per-time series computed for every initialization, shape (*inits, times).
SERIES = ("max_weight", "entropy", "eff_tokens", "winner", "top_share", "loss")
#: Default `atol` of the order statistics: the flow's default absolute tolerance.
ATOL = 1e-8


#: Squarings at most of the normalized Gram matrix in `top_singular_share`: eigenvalues
#: within a relative 40 / 2^SQUARINGS of the top one stay in, the rest are suppressed.
SQUARINGS = 48


@jax.jit
def top_singular_share(V: Float[Array, "... dim tokens"]) -> Float[Array, "..."]:
    """s_1^2 / sum_i s_i^2 over the singular values of V: 1 means rank one.

    sum s_i^2 = tr G and s_1^2 = lambda_max(G) for the Gram matrix G = V^T V (or V V^T,
    the smaller). lambda_max comes from repeated squaring, M <- M^2 / tr(M^2) from
    M = G / tr G, which tends to the projector on the top eigenvalues: tr(G M) is then
    lambda_max to within a relative 40 / 2^SQUARINGS (1e-13) of the eigenvalues it
    cannot separate, and to rounding otherwise. Each matrix stops squaring once a squaring
    moves no entry of M by more than 8 eps (it is a projector to rounding; 4 squarings for
    a polarized V), so its share does not depend on the others in the batch. Matrix
    products only: no LAPACK call,
    which on CPU can deadlock when several host devices run it at once
    (its batched SVD waits on the thread pool the devices occupy).
    """
    finite = jnp.all(jnp.isfinite(V), axis=(-2, -1))
    V = jnp.where(finite[..., None, None], V, 0.0)
    scale = jnp.max(jnp.abs(V), axis=(-2, -1), keepdims=True)  # the share is scale-free
    V = V / jnp.where(scale > 0, scale, 1.0)
    Vt = jnp.swapaxes(V, -1, -2)
    G = Vt @ V if V.shape[-1] <= V.shape[-2] else V @ Vt
    trace = lambda M: jnp.trace(M, axis1=-2, axis2=-1)[..., None, None]
    safe = lambda x: jnp.where(x > 0, x, 1.0)
    total = trace(G)
    tol = 8 * jnp.finfo(G.dtype).eps  # M's entries are at most 1 (tr M = 1, M >= 0)

    def square(carry):  # each matrix stops once a squaring no longer moves it
        k, M, settled = carry
        M2 = M @ M
        new = M2 / safe(trace(M2))
        still = jnp.max(jnp.abs(new - M), axis=(-2, -1)) <= tol
        return k + 1, jnp.where(settled[..., None, None], M, new), settled | still

    more = lambda carry: ~jnp.all(carry[2])
    start = (0, G / safe(total), jnp.zeros(G.shape[:-2], bool))
    # equinox's checkpointed loop: reverse-mode differentiable, as the fixed count was
    _, M, _ = eqxi.while_loop(more, square, start, max_steps=SQUARINGS, kind="checkpointed")
    top = trace(G @ M)[..., 0, 0]
    total = total[..., 0, 0]
    share = jnp.where(total > 0, top / jnp.where(total > 0, total, 1.0), 1.0)
    return jnp.where(finite, share, jnp.nan)


def _never_crosses(x: Float[Array, "... times tokens"]) -> Float[Array, "..."]:
    """True when no pair (i, j) has x_i - x_j change sign across times (ties allowed).

    Sorted by the final order, x must be non-decreasing at every time: a pair in
    the opposite order at some time is exactly a crossing (O(T log T), not O(T^2)).
    """
    order = jnp.argsort(x[..., -1, :], axis=-1)
    # ranked = x[..., order] by a one-hot product (exact for finite x; faster than a gather)
    tokens = jnp.arange(x.shape[-1]).reshape((1,) * order.ndim + (-1,))
    permutation = (order[..., :, None] == tokens).astype(x.dtype)
    ranked = jnp.einsum("...tj,...kj->...tk", x, permutation, precision="highest")
    return jnp.all(jnp.diff(ranked, axis=-1) >= 0, axis=(-2, -1))


def weight_series(weights: Float[Array, "... tokens"]) -> dict[str, Array]:
    """Max weight, entropy, effective number of tokens exp(H) and winner of each weight vector."""
    p = distribution(weights)
    H = entropy(p)
    return {
        "max_weight": jnp.max(p, axis=-1),
        "entropy": H,
        "eff_tokens": jnp.exp(H),
        "winner": jnp.argmax(p, axis=-1).astype(jnp.int32),
    }


def series(traj: Trajectory) -> dict[str, Array]:
    """Per-time statistics of every initialization (see `SERIES`), each (*inits, times)."""
    return _series_of(traj.value_path, traj.weights, traj.loss)


def _series_of(path: ValuePath, weights, loss) -> dict[str, Array]:
    return {**weight_series(weights), "top_share": top_singular_share(path.dense()), "loss": loss}


def order_statistics(
    traj: Trajectory, objective: AbstractObjective, *, atol: float = ATOL
) -> dict[str, Array]:
    """Order preservation and winner = argmax u(0), where u = V^T b (direction objectives).

    `order_preserved`: neither the u_j nor the logits a_j ever cross over the saved
    times (pairs tied at a time, e.g. a(0) = 0, count as no crossing). It is sampled
    at the saved times, not at every solver step (summaries say so in
    `order_checked_at`): a crossing undone between two saves is not seen.
    `order_measurable`: some logit moved by more than `atol` (the flow's absolute
    tolerance) from a(0). Where none did, the logits' order and the winner are set
    by solver error, not by the dynamics: the ensemble fractions leave these
    initializations out and count them (`order_not_measurable`).
    Returns an empty dict for objectives without a direction.
    """
    b = objective.direction()
    if b is None or traj.a.shape[-1] != traj.value_path.shape[-1]:
        return {}
    if not traj.batched:
        return {k: v[0] for k, v in order_statistics(_as_batch(traj), objective, atol=atol).items()}
    return _order_by_block(traj.value_path, traj.a, traj.weights, b, atol)


@jax.jit
@exact_matmuls
def _order_by_block(path: ValuePath, a, weights, b, atol) -> dict[str, Array]:
    """`_order_flags` of each initialization in the fixed-block program that
    `final_statistics` uses: one compile, where vmapped operation by operation about 30
    small programs were compiled on a first `summarize` (the toy's 1000 inits: 2.9-4.0 s
    for the summary then, 1.8-2.5 s now)."""
    b = jnp.broadcast_to(b, a.shape[:1] + b.shape[-1:])
    return blockwise(lambda x: _order_flags(*x, atol=atol), (path, a, weights, b))


def _order_flags(path: ValuePath, a, weights, b, *, atol: float = ATOL) -> dict[str, Array]:
    """The order statistics of one initialization (times first)."""
    u = path.project(b)
    winner = jnp.argmax(distribution(weights[-1]), axis=-1)
    return {
        "order_preserved": _never_crosses(u) & _never_crosses(a),
        "winner_is_argmax_u0": winner == jnp.argmax(u[0], axis=-1),
        "order_measurable": jnp.max(jnp.abs(a - a[:1])) > atol,
    }


def final_statistics(
    traj: Trajectory, objective: AbstractObjective, *, keep=None, atol: float = ATOL
) -> dict[str, Array]:
    """Per-initialization final statistics of a batched trajectory, from finite states only.

    `final_<name>` for max weight, entropy, effective tokens, winner, top singular
    share (one SVD, at the last time only) and loss, plus the order statistics for
    direction objectives; with `keep` (indices of saved times, ending with the last),
    also `snap_max_weight` and `snap_entropy` there (float32). An initialization
    with `ok` False gets NaN (winner -1, order flags False) instead of numbers
    computed from a failed state. Per initialization in fixed blocks, so the numbers
    never depend on the rest of the batch.
    """
    n = traj.ok.shape[0]
    b = objective.direction()
    flags = order_flags_apply(objective, traj.value_path, traj.a)
    b = jnp.broadcast_to(b, (n,) + b.shape[-1:]) if flags else jnp.zeros((n, 1), traj.a.dtype)
    keep = None if keep is None else tuple(int(k) for k in np.asarray(keep).reshape(-1))  # static
    return _final_by_block(traj.value_path, traj.a, traj.weights, traj.loss, traj.ok, b, flags, keep, atol)


@eqx.filter_jit
@exact_matmuls
def _final_by_block(path, a, weights, loss, ok, b, flags, keep, atol):
    one = lambda arrays: final_of_one(*arrays, flags=flags, keep=keep, atol=atol)
    return blockwise(one, (path, a, weights, loss, ok, b))


def final_of_one(
    path: ValuePath, a, weights, loss, ok, b, *, flags: bool, keep, atol: float = ATOL
) -> dict[str, Array]:
    """`final_statistics` of ONE initialization (times first); `flags`: with the order
    statistics along direction b (`atol`: see `order_statistics`); `keep`: a static
    tuple of saved-time indices or None."""
    # failed states are replaced by a finite stand-in, and their numbers by NaN
    path, a, weights, loss = jax.tree.map(
        lambda x: jnp.where(ok, x, jnp.zeros_like(x)), (path, a, weights, loss)
    )
    # the weight statistics at the kept times and the last only (elementwise per
    # time, so the same numbers as `summarize`'s over every time, to the last bit)
    n_times = weights.shape[0]
    times = np.arange(n_times) if keep is None else np.unique(np.append(keep, -1) % n_times)
    every = weight_series(weights[times])
    out = {f"final_{k}": v[-1] for k, v in every.items()}
    out["final_top_share"] = top_singular_share(path.at(-1))
    out["final_loss"] = loss[-1]
    if flags:
        out.update({f"final_{k}": v for k, v in _order_flags(path, a, weights, b, atol=atol).items()})
    if keep is not None:
        at = np.searchsorted(times, np.asarray(keep) % n_times)
        out["snap_max_weight"] = every["max_weight"][at].astype(jnp.float32)
        out["snap_entropy"] = every["entropy"][at].astype(jnp.float32)
    return {k: masked(v, ok) for k, v in out.items()}


def order_flags_apply(objective: AbstractObjective, path: ValuePath, a) -> bool:
    """Whether `final_statistics` reports the order statistics for this objective and trajectory."""
    return objective.direction() is not None and a.shape[-1] == path.shape[-1]


def masked(x, ok):
    """x where ok, else NaN (floats), -1 (integers) or False (flags)."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.where(ok, x, jnp.nan)
    if x.dtype == jnp.bool_:
        return x & ok
    return jnp.where(ok, x, -1)


@jax.jit
@exact_matmuls
def _series_by_block(traj: Trajectory) -> dict:
    # per initialization in the fixed-block program, so a statistic never depends
    # on which other initializations shared the batch (see `polarize.core._batching`)
    return blockwise(lambda arrays: _series_of(*arrays), (traj.value_path, traj.weights, traj.loss))


def _as_batch(traj: Trajectory) -> Trajectory:
    return jax.tree.map(lambda x: x if x is traj.ts else x[None], traj)


@dataclasses.dataclass(frozen=True)
class Summary:
    """Statistics of an ensemble.

    `ts`: saved times. `series`: name -> (inits, times) arrays. `final`: name ->
    (inits,) values at the last time, plus `ok`, `status` and the order flags.
    `aggregates`: ensemble numbers over the initializations that did not fail
    (None where undefined, e.g. order preservation without a target direction).
    """

    ts: np.ndarray
    series: dict
    final: dict
    aggregates: dict


def summarize(
    traj: Trajectory,
    objective: AbstractObjective,
    *,
    threshold: float = 0.9,
    hitting: dict | None = None,
    atol: float = ATOL,
) -> Summary:
    """Per-initialization statistics and ensemble aggregates of a trajectory.

    `atol`: the logits' smallest measurable move for the order statistics (the flow's
    absolute tolerance; see `order_statistics`).

    Works for one initialization too (it is treated as an ensemble of one).
    `hitting`: per-initialization hitting times (`polarize.hitting_times`) or rates to
    report with the rest (medians, 10/90% quantiles, fraction reached).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise PolarizeError(f"`threshold` must be a number in (0, 1]; got {threshold!r}")
    if not traj.batched:
        traj = _as_batch(traj)
        hitting = None if hitting is None else {k: np.asarray(v)[None] for k, v in hitting.items()}
    ser = {k: np.asarray(v) for k, v in _series_by_block(traj).items()}
    final = {k: v[:, -1] for k, v in ser.items()}
    final.update({k: np.asarray(v) for k, v in order_statistics(traj, objective, atol=atol).items()})
    final.update({k: np.asarray(v) for k, v in (hitting or {}).items()})
    ok = np.asarray(traj.ok)
    # a failed initialization's statistics are NaN (-1, False), as in a sweep's arrays:
    # its last states would otherwise read as polarized (NaN weights have entropy 0)
    ser = {k: _masked_host(v, ok) for k, v in ser.items()}
    final = {k: _masked_host(v, ok) for k, v in final.items()}
    final["ok"] = ok
    final["status"] = np.asarray(traj.status)
    return Summary(np.asarray(traj.ts), ser, final, aggregate(final, threshold))


def _masked_host(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """`masked` on the host: x where ok (over its first axis), else NaN, -1 or False."""
    keep = ok.reshape(ok.shape + (1,) * (x.ndim - 1))
    if np.issubdtype(x.dtype, np.floating):
        return np.where(keep, x, np.nan)
    if x.dtype == np.bool_:
        return x & keep
    return np.where(keep, x, -1)


def aggregate(final: dict, threshold: float = 0.9) -> dict:
    """Ensemble numbers from per-initialization final values; failed ones are counted, not used.

    Hitting times (`time_to_*`) get `median_`, `q10_`, `q90_` (over the initializations
    that did not fail, inf where most never reached the level) and `fraction_reached_`;
    rates (`rate_*`) a median and 10/90% quantiles; failures a count per status name
    (`failed_<name>`).
    """

    ok = np.asarray(final["ok"], bool)
    n = int(ok.size)
    measurable = ok & np.asarray(final.get("order_measurable", ok), bool)

    def over_ok(name, fn, where=ok):
        if name not in final or not where.any():
            return None
        return float(fn(np.asarray(final[name])[where]))

    out = {
        "n_inits": n,
        "n_failed": int(n - ok.sum()),
        "one_hot_threshold": float(threshold),
        "one_hot_fraction": over_ok("max_weight", lambda x: np.mean(x >= threshold)),
        "median_max_weight": over_ok("max_weight", np.median),
        "median_entropy": over_ok("entropy", np.median),
        "median_eff_tokens": over_ok("eff_tokens", np.median),
        "median_top_share": over_ok("top_share", np.median),
        "median_loss": over_ok("loss", np.median),
        "order_preserved_fraction": over_ok("order_preserved", np.mean, measurable),
        "winner_is_argmax_u0_fraction": over_ok("winner_is_argmax_u0", np.mean, measurable),
    }
    if "order_preserved" in final:
        out["order_checked_at"] = "saved times"
        out["order_not_measurable"] = int(np.sum(ok & ~measurable))
    if "status" in final:
        out.update({f"failed_{name}": k for name, k in counts(np.asarray(final["status"])[~ok]).items()})
    for name in final:
        if name.startswith("time_to_"):
            x = np.asarray(final[name], dtype=float)[ok]
            for q in (50, 10, 90):
                out[f"{'median' if q == 50 else f'q{q}'}_{name}"] = quantile(x, q / 100)
            reached = name.removeprefix("time_to_")
            out[f"fraction_reached_{reached}"] = float(np.mean(np.isfinite(x))) if x.size else None
        if name.startswith("rate_"):
            x = np.asarray(final[name], dtype=float)[ok]
            x = x[np.isfinite(x)]
            for q in (50, 10, 90):
                out[f"{'median' if q == 50 else f'q{q}'}_{name}"] = quantile(x, q / 100)
    return out
