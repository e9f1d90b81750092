"""The asymptotic rate of polarization under a logistic loss: 1 - max s ~ C / (log t)^2."""

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


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
    t1 = float(ts[-1] if t1 is None else t1)
    window = (ts >= t1 / 10) & (ts <= t1) & (ts > 1)
    mw = jnp.asarray(max_weight)
    if t1 < 100 or window.sum() < 2:
        nan = jnp.full(mw.shape[:-1], jnp.nan, dtype=mw.dtype)
        return {"rate_C": nan, "rate_drift": nan}
    gap = 1.0 - mw[..., np.flatnonzero(window)]
    product = gap * jnp.broadcast_to(np.log(ts[window]) ** 2, gap.shape)
    valid = jnp.all(jnp.isfinite(product) & (product > 0), axis=-1)
    safe = jnp.where(valid[..., None], product, 1.0)
    C = jnp.exp(jnp.mean(jnp.log(safe), axis=-1))
    drift = safe[..., -1] / safe[..., 0] - 1
    return {"rate_C": jnp.where(valid, C, jnp.nan), "rate_drift": jnp.where(valid, drift, jnp.nan)}
