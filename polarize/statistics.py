"""Polarization statistics of a trajectory, per initialization and over the ensemble.

Weights are read as an attention distribution p = |s| / sum |s| (uniform when
s = 0), so unnormalized maps (sigmoid, relu, linear) are measured on the same
scale as softmax, the convention also used for attention sinks.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .ensembles import blockwise
from .objectives import AbstractObjective
from .trajectory import Trajectory

#: Per-time series computed for every initialization, shape (*inits, times).
SERIES = ("max_weight", "entropy", "eff_tokens", "winner", "top_share", "loss")


def distribution(weights: Float[Array, "... tokens"]) -> Float[Array, "... tokens"]:
    """p = |s| / sum |s| along the last axis (uniform where s = 0)."""
    mass = jnp.abs(weights)
    total = jnp.sum(mass, axis=-1, keepdims=True)
    zero = total == 0
    return jnp.where(zero, 1.0 / weights.shape[-1], mass / jnp.where(zero, 1.0, total))


def entropy(p: Float[Array, "... tokens"]) -> Float[Array, "..."]:
    """H(p) = -sum p log p, with 0 log 0 = 0 (natural log)."""
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)


def top_singular_share(V: Float[Array, "... dim tokens"]) -> Float[Array, "..."]:
    """s_1^2 / sum_i s_i^2 over the singular values of V: 1 means rank one."""
    sv = jnp.linalg.svd(V, compute_uv=False)
    total = jnp.sum(sv**2, axis=-1)
    return jnp.where(total > 0, sv[..., 0] ** 2 / jnp.where(total > 0, total, 1.0), 1.0)


def _never_crosses(x: Float[Array, "... times tokens"]) -> Float[Array, "..."]:
    """True when no pair (i, j) has x_i - x_j change sign across times (ties allowed).

    Sorted by the final order, x must be non-decreasing at every time: a pair in
    the opposite order at some time is exactly a crossing (O(T log T), not O(T^2)).
    """
    order = jnp.argsort(x[..., -1:, :], axis=-1)
    ranked = jnp.take_along_axis(x, jnp.broadcast_to(order, x.shape), axis=-1)
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
    return {**weight_series(traj.weights), "top_share": top_singular_share(traj.V), "loss": traj.loss}


def order_statistics(traj: Trajectory, objective: AbstractObjective) -> dict[str, Array]:
    """Order preservation and winner = argmax u(0), where u = V^T b (direction objectives).

    `order_preserved`: neither the u_j nor the logits a_j ever cross over the saved
    times (pairs tied at a time, e.g. a(0) = 0, count as no crossing).
    Returns an empty dict for objectives without a direction.
    """
    b = objective.direction()
    if b is None or traj.a.shape[-1] != traj.V.shape[-1]:
        return {}
    if not traj.batched:
        return {k: v[0] for k, v in order_statistics(_as_batch(traj), objective).items()}
    b = jnp.broadcast_to(b, traj.V.shape[:1] + b.shape[-1:])
    u = jnp.einsum("ntdk,nd->ntk", traj.V, b)
    winner = jnp.argmax(distribution(traj.weights[..., -1, :]), axis=-1)
    return {
        "order_preserved": _never_crosses(u) & _never_crosses(traj.a),
        "winner_is_argmax_u0": winner == jnp.argmax(u[..., 0, :], axis=-1),
    }


@jax.jit
def _series_by_block(traj: Trajectory) -> dict:
    # per initialization in the fixed-block program, so a statistic never depends
    # on which other initializations shared the batch (see `polarize.ensembles`)
    def one(arrays):
        V, a, weights, loss = arrays
        single = Trajectory(
            ts=traj.ts, V=V, a=a, weights=weights, loss=loss, ok=jnp.asarray(True), status=jnp.asarray(0)
        )
        return series(single)

    return blockwise(one, (traj.V, traj.a, traj.weights, traj.loss))


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


def summarize(traj: Trajectory, objective: AbstractObjective, *, threshold: float = 0.9) -> Summary:
    """Per-initialization statistics and ensemble aggregates of a trajectory.

    Works for one initialization too (it is treated as an ensemble of one).
    """
    if not traj.batched:
        traj = _as_batch(traj)
    ser = {k: np.asarray(v) for k, v in _series_by_block(traj).items()}
    final = {k: v[:, -1] for k, v in ser.items()}
    final.update({k: np.asarray(v) for k, v in order_statistics(traj, objective).items()})
    final["ok"] = np.asarray(traj.ok)
    final["status"] = np.asarray(traj.status)
    return Summary(np.asarray(traj.ts), ser, final, aggregate(final, threshold))


def aggregate(final: dict, threshold: float = 0.9) -> dict:
    """Ensemble numbers from per-initialization final values; failed ones are counted, not used."""
    ok = np.asarray(final["ok"], bool)
    n = int(ok.size)

    def over_ok(name, fn):
        if name not in final or not ok.any():
            return None
        return float(fn(np.asarray(final[name])[ok]))

    return {
        "n_inits": n,
        "n_failed": int(n - ok.sum()),
        "one_hot_threshold": float(threshold),
        "one_hot_fraction": over_ok("max_weight", lambda x: np.mean(x >= threshold)),
        "median_max_weight": over_ok("max_weight", np.median),
        "median_entropy": over_ok("entropy", np.median),
        "median_eff_tokens": over_ok("eff_tokens", np.median),
        "median_top_share": over_ok("top_share", np.median),
        "median_loss": over_ok("loss", np.median),
        "order_preserved_fraction": over_ok("order_preserved", np.mean),
        "winner_is_argmax_u0_fraction": over_ok("winner_is_argmax_u0", np.mean),
    }
