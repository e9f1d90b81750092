"""Training objectives L(beta) on the model output beta, and builders for them.

Like models, an objective may carry a leading batch axis (one dataset or target
per initialization); `core_ndim` gives each array's rank for a single one.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .errors import PolarizeError, check_positive
from .models import _check_finite, as_key


class AbstractObjective(eqx.Module):
    """A scalar loss of beta = V sigma(a)."""

    core_ndim: ClassVar[dict[str, int]]

    def __call__(self, beta: Float[Array, " dim"]) -> Float[Array, ""]:
        raise NotImplementedError

    def direction(self) -> Float[Array, "*batch dim"] | None:
        """The unit target direction b when the loss depends on beta only through <b, beta>."""
        return None

    @property
    def batch_size(self) -> int | None:
        for name, nd in self.core_ndim.items():
            x = getattr(self, name)
            if x.ndim > nd:
                return x.shape[0]
        return None


class LogisticDirection(AbstractObjective):
    """L = log(1 + exp(-<b, beta>)) along a unit direction b (normalized on construction)."""

    b: Float[Array, "*batch dim"]
    core_ndim: ClassVar[dict[str, int]] = {"b": 1}

    def __init__(self, b):
        b = jnp.asarray(b)
        _check_finite("b", b)
        if b.ndim not in (1, 2):
            raise PolarizeError(f"`b` must have shape (dim,) or (inits, dim); got {b.shape}")
        norm = jnp.linalg.norm(b, axis=-1, keepdims=True)
        if not isinstance(b, jax.core.Tracer) and np.any(np.asarray(norm) == 0):
            raise PolarizeError("`b` must be non-zero")
        self.b = b / norm

    def __call__(self, beta):
        return jax.nn.softplus(-jnp.dot(self.b, beta))

    def direction(self):
        return self.b


class LogisticData(AbstractObjective):
    """Mean logistic loss over a labelled dataset: mean_i log(1 + exp(-y_i <x_i, beta>)), y in {-1, +1}."""

    X: Float[Array, "*batch samples dim"]
    y: Float[Array, "*batch samples"]
    core_ndim: ClassVar[dict[str, int]] = {"X": 2, "y": 1}

    def __init__(self, X, y):
        self.X, self.y = jnp.asarray(X), jnp.asarray(y, dtype=jnp.result_type(float))
        _check_data_shapes(self.X, self.y)
        if not isinstance(self.y, jax.core.Tracer) and not np.all(np.abs(np.asarray(self.y)) == 1):
            raise PolarizeError("`y` must hold labels -1 or +1 for LogisticData")

    def __call__(self, beta):
        return jnp.mean(jax.nn.softplus(-self.y * (self.X @ beta)))


class Square(AbstractObjective):
    """L = |y - X beta|^2 (X = identity when None: L = |y - beta|^2)."""

    X: Float[Array, "*batch samples dim"]
    y: Float[Array, "*batch samples"]
    core_ndim: ClassVar[dict[str, int]] = {"X": 2, "y": 1}

    def __init__(self, X, y):
        self.y = jnp.asarray(y)
        if X is None:
            X = jnp.broadcast_to(
                jnp.eye(self.y.shape[-1], dtype=self.y.dtype), self.y.shape[:-1] + self.y.shape[-1:] * 2
            )
        self.X = jnp.asarray(X)
        _check_data_shapes(self.X, self.y)

    def __call__(self, beta):
        return jnp.sum(jnp.square(self.y - self.X @ beta))


class CrossEntropy(AbstractObjective):
    """L = -sum_k p_k log softmax(beta)_k for a target distribution p over dim classes."""

    p: Float[Array, "*batch dim"]
    core_ndim: ClassVar[dict[str, int]] = {"p": 1}

    def __init__(self, p):
        self.p = jnp.asarray(p)
        _check_finite("p", self.p)
        if self.p.ndim not in (1, 2):
            raise PolarizeError(f"`p` must have shape (dim,) or (inits, dim); got {self.p.shape}")
        if not isinstance(self.p, jax.core.Tracer):
            p = np.asarray(self.p)
            if np.any(p < 0) or not np.allclose(p.sum(-1), 1.0, atol=1e-6):
                raise PolarizeError("`p` must be a probability vector (non-negative, summing to 1)")

    def __call__(self, beta):
        return -jnp.sum(self.p * jax.nn.log_softmax(beta))


def _check_data_shapes(X, y) -> None:
    _check_finite("X", X)
    _check_finite("y", y)
    if X.ndim not in (2, 3) or y.ndim != X.ndim - 1 or X.shape[:-1] != y.shape:
        raise PolarizeError(
            f"`X` of shape (samples, dim) needs `y` of shape (samples,) (each with an optional "
            f"leading inits axis); got X {X.shape} and y {y.shape}"
        )


def random_direction(key: PRNGKeyArray | int, dim: int) -> LogisticDirection:
    """LogisticDirection along b ~ N(0, I_dim) / |.|."""
    dim = check_positive("dim", dim, integer=True)
    return LogisticDirection(jax.random.normal(as_key(key), (dim,)))


def conditioned_regression(key: PRNGKeyArray | int, n: int, dim: int, kappa: float) -> Square:
    """Square(X, y) with X = U diag(linspace(1, 1/kappa)) W^T and y ~ N(0, I_n).

    U and W come from the SVD of a Gaussian n x dim matrix, so kappa is exactly the
    condition number of X.
    """
    n = check_positive("n", n, integer=True)
    dim = check_positive("dim", dim, integer=True)
    kappa = check_positive("kappa", kappa)
    if kappa < 1:
        raise PolarizeError(f"`kappa` must be >= 1 (a condition number); got {kappa!r}")
    kg, ky = jax.random.split(as_key(key))
    G = jax.random.normal(kg, (n, dim))
    U, _, Wt = jnp.linalg.svd(G, full_matrices=False)
    sv = jnp.linspace(1.0, 1.0 / kappa, min(n, dim))
    X = (U * sv[None, :]) @ Wt
    y = jax.random.normal(ky, (n,))
    return Square(X, y)


def random_labels(key: PRNGKeyArray | int, n: int, dim: int) -> LogisticData:
    """LogisticData with Gaussian inputs labelled by a random teacher: y = sign(<w, x>)."""
    n = check_positive("n", n, integer=True)
    dim = check_positive("dim", dim, integer=True)
    kx, kw = jax.random.split(as_key(key))
    X = jax.random.normal(kx, (n, dim))
    y = jnp.where(X @ jax.random.normal(kw, (dim,)) >= 0, 1.0, -1.0)
    return LogisticData(X, y)


def peaked_distribution(key: PRNGKeyArray | int, dim: int, sharpness: float = 10.0) -> CrossEntropy:
    """CrossEntropy with the paper's target p = softmax(sharpness * U[0, 1])."""
    dim = check_positive("dim", dim, integer=True)
    return CrossEntropy(jax.nn.softmax(sharpness * jax.random.uniform(as_key(key), (dim,))))
