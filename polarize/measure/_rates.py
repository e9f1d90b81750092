"""The asymptotic rate of polarization under a logistic loss: 1 - max s ~ C / (log t)^2."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ..core._batching import blockwise
from ..core._errors import PolarizeError


def logistic_rate(ts, max_weight, *, t1: float | None = None) -> dict[str, Array]:
    """C fitted from 1 - max s = C / (log t)^2 over the last decade [t1 / 10, t1] of the horizon.

    Per initialization, C is the geometric mean of (1 - max s(t)) (log t)^2 over the
    saved times in that decade; `rate_drift` is the relative change of that product
    from the decade's first to its last saved time.

    When the fit is meaningful: under a logistic loss, once the run has polarized
    (max weight near 1, one token winning), where 1 - max s ~ C / (log t)^2 holds up
    to O(log log t / log t) corrections; a `rate_drift` of a few percent says the
    horizon is in that regime, a large one that it is not (raise t1). It needs
    t1 >= 100 and at least two saved times in the decade, else NaN, as where
    max s = 1 in floating point or the run failed.

    Args:
        ts: saved times (times,). max_weight: (inits, times) or (times,).
        t1: the horizon (default: the last saved time).
    Returns:
        {"rate_C": (inits,), "rate_drift": (inits,)}.
    """
    ts = np.asarray(ts, dtype=float)  # concrete: the window is chosen here
    mw = jnp.asarray(max_weight)
    if ts.ndim != 1 or ts.size == 0 or mw.ndim == 0 or mw.shape[-1] != ts.size:
        raise PolarizeError(
            "`max_weight` must hold one value per saved time on its last axis, `ts` the "
            f"saved times (times,); got ts {ts.shape} and max_weight {mw.shape}"
        )
    t1 = float(ts[-1] if t1 is None else t1)
    window = (ts >= t1 / 10) & (ts <= t1) & (ts > 1)
    if t1 < 100 or window.sum() < 2:
        nan = jnp.full(mw.shape[:-1], jnp.nan, dtype=mw.dtype)
        return {"rate_C": nan, "rate_drift": nan}
    at, log_squared = jnp.asarray(np.flatnonzero(window)), jnp.asarray(np.log(ts[window]) ** 2)
    if mw.ndim == 1:  # one initialization (as inside a sweep's per-init reduction)
        return _rate_of_one(mw, at, log_squared)
    return _rate_by_block(mw.reshape(-1, mw.shape[-1]), at, log_squared, mw.shape[:-1])


@eqx.filter_jit
def _rate_by_block(max_weight, at, log_squared, shape):
    # per initialization in the fixed-block program, so a rate never depends on which
    # other initializations shared the batch (see `polarize.core._batching`)
    out = blockwise(lambda mw: _rate_of_one(mw, at, log_squared), max_weight)
    return {k: v.reshape(shape) for k, v in out.items()}


def _rate_of_one(max_weight, at, log_squared) -> dict[str, Array]:
    """`logistic_rate` of one initialization's (times,) max weights, the decade's saved
    times at indices `at`, their (log t)^2 `log_squared`."""
    product = (1.0 - max_weight[at]) * log_squared
    valid = jnp.all(jnp.isfinite(product) & (product > 0))
    safe = jnp.where(valid, product, 1.0)
    C = jnp.exp(jnp.mean(jnp.log(safe)))
    drift = safe[-1] / safe[0] - 1
    return {"rate_C": jnp.where(valid, C, jnp.nan), "rate_drift": jnp.where(valid, drift, jnp.nan)}
