"""The hard-margin SVMs that prompt attention converges to in direction (Tarzanagh et al. 2023).

- the attention SVM of a selection (one token sel_i per sample):
  p_mm = argmin |p| subject to (x_{i,sel_i} - x_{i,t})^T p >= 1 for all i and t != sel_i;
- the value SVM of joint training: v_mm = argmin |v| subject to y_i x_{i,sel_i}^T v >= 1.

Both are least-distance programs, min |x| subject to G x >= h, solved exactly by the
nonnegative least squares problem of Lawson and Hanson (Solving Least Squares Problems,
1974, ch. 23): with E = [G^T; h^T] and f = (0, ..., 0, 1), NNLS gives u >= 0 minimizing
|E u - f|, and then x = -r_{1..d} / r_{d+1} for the residual r = E u - f; r = 0 means the
constraints are inconsistent. `scipy.optimize.nnls` (an active-set method that ends in
finitely many steps) solves it to machine precision with no tolerance to tune, and the
vanishing residual tells infeasibility apart from a large margin without a solver status
to interpret. These run on the host with numpy and scipy, outside `jax.jit`: a batch of
selections is a batch of small programs, solved in a loop. scipy.optimize is imported
on the first solve (the one deliberate lazy import here): it takes about 0.35 s, and a
sweep of value attention, whose modules import this one, never solves an SVM.
"""

from typing import NamedTuple

import numpy as np

from ..core._errors import PolarizeError

#: A selection whose max-margin norm would exceed this is reported infeasible: the NNLS
#: residual -r_{d+1} = |r|^2 = 1 / (1 + |x|^2) then falls below 1e-12, where rounding in
#: an infeasible program's residual (zero in exact arithmetic) could reach.
MAX_NORM = 1e6


class MaxMargin(NamedTuple):
    """The max-margin vectors of a batch of selections: `direction` (..., dim), NaN where
    `feasible` (...,) is False, and the margin norm |x| (..., ) (inf where infeasible)."""

    direction: np.ndarray
    feasible: np.ndarray
    norm: np.ndarray


def least_distance(G: np.ndarray, h: np.ndarray) -> np.ndarray | None:
    """x = argmin |x| subject to G x >= h (Lawson-Hanson NNLS), or None when infeasible."""
    G, h = np.asarray(G, np.float64), np.asarray(h, np.float64)
    d = G.shape[1]
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(d + 1)
    f[-1] = 1.0
    from scipy.optimize import nnls

    u, _ = nnls(E, f, maxiter=50 * E.shape[1])
    r = E @ u - f
    if not r[-1] < -1.0 / (1.0 + MAX_NORM**2):
        return None
    return -r[:-1] / r[-1]


def _selections(X, selected):
    X = np.asarray(X, np.float64)
    if X.ndim != 3:
        raise PolarizeError(f"`X` must have shape (samples, tokens, dim); got {X.shape}")
    sel = np.asarray(selected)
    if sel.shape[-1:] != X.shape[:1] or not np.issubdtype(sel.dtype, np.integer):
        raise PolarizeError(
            f"`selected` must hold one token index per sample, shape (..., {X.shape[0]}), "
            f"integers; got shape {sel.shape} of {sel.dtype}"
        )
    if np.any((sel < 0) | (sel >= X.shape[1])):
        raise PolarizeError(
            f"`selected` must hold token indices in [0, {X.shape[1]}); got {sel.min()}..{sel.max()}"
        )
    return X, sel


def _solve_all(problems, batch_shape, dim: int, single: bool, what: str) -> MaxMargin:
    out = np.full((len(problems), dim), np.nan)
    for k, (G, h) in enumerate(problems):
        x = least_distance(G, h)
        if x is not None:
            out[k] = x
    feasible = np.isfinite(out[:, 0])
    if single and not feasible[0]:
        raise PolarizeError(f"{what} is infeasible: no vector separates it with a positive margin")
    norm = np.where(feasible, np.linalg.norm(np.nan_to_num(out), axis=-1), np.inf)
    shape = batch_shape
    return MaxMargin(out.reshape(shape + (dim,)), feasible.reshape(shape), norm.reshape(shape))


def attention_svm(X, selected) -> MaxMargin:
    """p_mm = argmin |p| s.t. (x_{i,sel_i} - x_{i,t})^T p >= 1 for every sample i and t != sel_i.

    Args:
        X: tokens (samples, tokens, dim).
        selected: one token index per sample, (samples,), or a batch (..., samples).

    Returns:
        `MaxMargin(direction, feasible, norm)` with direction (..., dim) the max-margin
        vector itself (not normalized). A single infeasible selection raises a
        `PolarizeError`; in a batch it is `feasible=False` with a NaN direction. Runs on
        the host (scipy NNLS), not under `jax.jit`.
    """
    X, sel = _selections(X, selected)
    n, T, d = X.shape
    flat = sel.reshape(-1, n)
    others = [np.array([t for t in range(T) if t != s]) for s in range(T)]
    problems = []
    for row in flat:
        G = np.concatenate([X[i, row[i]][None, :] - X[i, others[row[i]]] for i in range(n)])
        problems.append((G, np.ones(len(G))))
    return _solve_all(
        problems, sel.shape[:-1], d, sel.ndim == 1, f"the attention SVM of selection {sel.tolist()}"
    )


def value_svm(X, y, selected) -> MaxMargin:
    """v_mm = argmin |v| s.t. y_i x_{i,sel_i}^T v >= 1 for every sample i (joint training).

    Arguments and result as for `attention_svm`, with labels `y` (samples,).
    """
    X, sel = _selections(X, selected)
    y = np.asarray(y, np.float64)
    if y.shape != X.shape[:1]:
        raise PolarizeError(f"`y` must have shape ({X.shape[0]},); got {y.shape}")
    n, _, d = X.shape
    flat = sel.reshape(-1, n)
    problems = [(y[:, None] * X[np.arange(n), row], np.ones(n)) for row in flat]
    return _solve_all(
        problems, sel.shape[:-1], d, sel.ndim == 1, f"the value SVM of selection {sel.tolist()}"
    )


def best_tokens(X, y, v) -> np.ndarray:
    """The best-score token of every sample, argmax_t y_i v^T x_{i,t}: (..., samples) for v (..., dim)."""
    X, y, v = np.asarray(X), np.asarray(y), np.asarray(v)
    scores = y[:, None] * np.einsum("ntd,...d->...nt", X, v)
    return np.argmax(scores, axis=-1)
