"""What a user chooses by name, and the defaults of the numbers a run is measured at.

Plain Python, no JAX: the CLI parses and validates every argument with these before
JAX is imported. The registries that build the objects (`NORMALIZATIONS` in
`_normalizations`, a sweep's `OBJECTIVES` and `SOLVERS`) hold exactly these names.
"""

import os

import numpy as np

from ._errors import PolarizeError

#: The normalizations, by name (`polarize.NORMALIZATIONS` maps each to its class).
NORMALIZATION_NAMES = (
    "softmax",
    "sigmoid",
    "relu",
    "linear",
    "relu-norm",
    "sum-norm",
    "l1-norm",
    "square-norm",
    "sigmoid-norm",
    "softmax1",
    "sparsemax",
)
#: Initializations per vmapped block on CPU (part of a result's identity: keep it fixed).
BLOCK_SIZE = 128
#: Default max-weight levels of the hitting times.
LEVELS = (0.5, 0.9, 0.99)
#: Default loss level, as a fraction of the loss at the start.
LOSS_FRACTION = 1e-3
#: Per-initialization statistics a study can plot (besides time_to_* of the cell's levels).
PER_INIT = ("max_weight", "entropy", "eff_tokens", "top_share", "loss", "rate_C", "rate_drift")
#: Ensemble fractions from summary.json a study can plot (besides fraction_reached_*).
FRACTIONS = ("one_hot_fraction", "order_preserved_fraction", "winner_is_argmax_u0_fraction")
#: The same two for a sweep of prompt attention (its token selection: `runs._sweep`).
PROMPT_PER_INIT = (
    "max_weight",
    "entropy",
    "loss",
    "share_best",
    "cos_selected",
    "cos_best",
    "p_norm",
    "log_slope",
    "svm_norm",
    "cos_value",
)
PROMPT_FRACTIONS = ("one_hot_fraction", "share_global_selection")
#: Default threshold eps of a sink head (`measure.sinks`): mean attention on one key above it.
SINK_EPS = 0.3
#: How sink metrics read a row (`measure.sinks`): |A| renormalized (the default), the
#: positive part renormalized, or the weights as given.
SINK_MASSES = ("abs", "positive", "raw")
SINK_MASS = "abs"


def check_levels(levels) -> tuple[float, ...]:
    """`levels` as a sorted tuple of distinct floats in (0, 1], or a `PolarizeError`."""
    try:
        values = tuple(float(x) for x in np.atleast_1d(np.asarray(levels, dtype=float)))
    except (TypeError, ValueError):
        raise PolarizeError(f"`levels` must be numbers in (0, 1]; got {levels!r}") from None
    bad = [x for x in values if not 0 < x <= 1]
    if not values or bad:
        raise PolarizeError(f"`levels` must be numbers in (0, 1]; got {list(values)!r}")
    return tuple(sorted(set(values)))


def time_names(levels=LEVELS, loss_fraction: float | None = LOSS_FRACTION) -> list[str]:
    """Names of the hitting times: `time_to_<level>` and `time_to_loss_<fraction>`."""
    names = [f"time_to_{level:g}" for level in levels]
    if loss_fraction is not None:
        names.append(f"time_to_loss_{loss_fraction:g}")
    return names


def cpu_threads() -> int:
    """Chunks of blocks `in_threads` runs side by side: $POLARIZE_THREADS, else the CPU
    cores this process may use (1 turns it off)."""
    value = os.environ.get("POLARIZE_THREADS")
    if value is not None:
        if not value.isdigit() or int(value) < 1:
            raise PolarizeError(f"POLARIZE_THREADS must be a whole number >= 1; got {value!r}")
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
