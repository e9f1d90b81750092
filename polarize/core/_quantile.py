"""The quantile of a sample where a level never reached is an infinite time: plain numpy,
no JAX (a study's figure is drawn from it in a process that never loads JAX)."""

import numpy as np


def quantile(x, q: float) -> float | None:
    """The q-quantile of x with linear interpolation, inf where it falls next to an inf.

    (numpy gives NaN between two infs: here a level never reached by most
    initializations has an infinite median, as it should.) None for an empty x.
    """
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return None
    pos = q * (x.size - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    x = np.partition(x, (lo, hi))  # the two order statistics only (NaN last, as in a sort)
    if np.isinf(x[hi]) or lo == hi:
        return float(x[hi] if lo != hi else x[lo])
    return float(x[lo] + (pos - lo) * (x[hi] - x[lo]))
