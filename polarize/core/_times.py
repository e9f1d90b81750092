"""Time grids and their checks, shared by `flow`, `modified_flow` and sweeps.

Times are physical, 0 <= t0 < t1, both finite; saved times lie in [t0, t1] and do
not decrease. The checks hold for traced times too (under `jax.jit` or `jax.grad`):
they then stop the computation at run time with the same message (`eqx.error_if`).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._errors import PolarizeError
from ._refuse import refuse_if, shown


def save_steps(steps: int, n_save: int = 64) -> np.ndarray:
    """About n_save distinct step indices from 0 to steps, evenly spaced in log(1 + k)."""
    raw = np.expm1(np.linspace(0.0, np.log1p(steps), n_save))
    return np.unique(np.concatenate([[0], np.round(raw).astype(np.int64), [steps]]))


def save_times(t1: float, n_save: int = 64, t0: float = 0.0) -> np.ndarray:
    """n_save times from t0 to t1, evenly spaced in log(1 + t) (t0 and t1 included)."""
    ts = np.expm1(np.linspace(np.log1p(t0), np.log1p(t1), n_save))
    ts[0], ts[-1] = t0, t1  # exact ends: log1p/expm1 can round one ulp past t1
    return ts


def _as_times(t, dtype, name: str) -> Array:
    """`t` as an array of `dtype`: numbers in host memory (Python's, numpy's) converted by
    numpy, without the XLA program `jnp.asarray` compiles per shape in a fresh process;
    JAX arrays (concrete or traced) by `jnp.asarray`. Anything that is not numbers (a
    string, None) is refused by `name`."""
    what = "a 1-D array of finite times" if name == "ts" else "a finite number"
    try:
        kind = t.dtype.kind if hasattr(t, "dtype") else np.asarray(t).dtype.kind
    except (TypeError, ValueError):  # a ragged list
        kind = "O"
    # strings too: numpy and jax.numpy would read "1e3" as 1000.0
    if kind not in "biuf" or (name != "ts" and np.ndim(t) != 0):
        raise PolarizeError(f"`{name}` must be {what}; got {t!r}")
    if isinstance(t, int | float | np.number | np.ndarray):
        return jax.device_put(np.asarray(t, dtype))
    return jnp.asarray(t, dtype)


def check_times(
    t0: Float[ArrayLike, ""],
    t1: Float[ArrayLike, ""],
    ts: Float[ArrayLike, " times"] | None = None,
    *,
    n_save: int = 64,
    dtype=None,
) -> tuple[Float[Array, ""], Float[Array, ""], Float[Array, " times"]]:
    """(t0, t1, ts) as arrays of `dtype`, refused unless 0 <= t0 < t1 finite and ts in [t0, t1].

    `ts` defaults to `save_times(t1, n_save, t0)`. `dtype` is the flow's floating dtype;
    1 + t1 must be representable in it (float32 holds t up to about 1.7e38).
    """
    check = jnp.result_type(float)  # checks in the widest float available
    with jax.ensure_compile_time_eval():  # concrete times stay concrete inside a caller's trace
        t0_, t1_ = _as_times(t0, check, "t0"), _as_times(t1, check, "t1")
    t0_ = refuse_if(t0_, lambda t, xp: ~xp.isfinite(t), f"`t0` must be finite; got t0={shown(t0)}")
    t1_ = refuse_if(t1_, lambda t, xp: ~xp.isfinite(t), f"`t1` must be finite; got t1={shown(t1)}")
    t0_ = refuse_if(t0_, lambda t, xp: t < 0, f"`t0` must be >= 0; got t0={shown(t0)}")
    t0_, t1_ = refuse_if(
        (t0_, t1_),
        lambda t, xp: ~(t[1] > t[0]),
        f"`t1` must be greater than `t0`; got t0={shown(t0)}, t1={shown(t1)}",
    )
    dtype = jnp.dtype(dtype or check)
    limit = float(jnp.finfo(dtype).max) / 2
    t1_ = refuse_if(
        t1_,
        lambda t, xp: t > limit,
        f"`t1` must be below {limit:.2g} for a {dtype.name} flow (1 + t must be representable); "
        f"got t1={shown(t1)}: use precision='float64' or a shorter horizon",
    )
    traced = isinstance(t0_, jax.core.Tracer) or isinstance(t1_, jax.core.Tracer)
    if ts is None and traced:
        grid = jnp.expm1(jnp.linspace(jnp.log1p(t0_), jnp.log1p(t1_), n_save))
        ts_ = grid.at[0].set(t0_).at[-1].set(t1_)
    elif ts is None:
        ts_ = jnp.asarray(save_times(float(t1_), n_save, float(t0_)), check)
    else:
        with jax.ensure_compile_time_eval():
            ts_ = _as_times(ts, check, "ts")
        if ts_.ndim != 1 or ts_.size == 0:
            raise PolarizeError(f"`ts` must be a non-empty 1-D array of finite times; got shape {ts_.shape}")
        ts_ = refuse_if(
            ts_, lambda t, xp: ~xp.isfinite(t), "`ts` must be a non-empty 1-D array of finite times"
        )
        ts_, _, _ = refuse_if(
            (ts_, t0_, t1_),
            lambda x, xp: xp.any(xp.diff(x[0]) < 0) | (x[0][0] < x[1]) | (x[0][-1] > x[2]),
            f"`ts` must be non-decreasing and lie in [t0, t1] = [{shown(t0)}, {shown(t1)}]",
        )
    return t0_.astype(dtype), t1_.astype(dtype), ts_.astype(dtype)
