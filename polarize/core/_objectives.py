"""Training objectives L(beta) on the model output beta, and builders for them.

Like models, an objective may carry a leading batch axis (one dataset or target
per initialization); `core_ndim` gives each array's rank for a single one.
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._errors import PolarizeError, check_positive
from ._models import as_key, finite
from ._refuse import refuse_if


class AbstractObjective(eqx.Module):
    """A scalar loss of beta = V sigma(a), with its gradient.

    `grad(beta)` is jax.grad of the loss unless a final class writes it in closed form.
    An objective of one direction, L = l(<b, beta>), returns b from `direction()` and
    the scalar residual e = -l'(m) from `residual(m)`.
    """

    core_ndim: ClassVar[dict[str, int]]

    @abc.abstractmethod
    def __call__(self, beta: Float[Array, " dim"]) -> Float[Array, ""]:
        raise NotImplementedError

    def grad(self, beta: Float[Array, " dim"]) -> Float[Array, " dim"]:
        """grad L(beta)."""
        return jax.grad(self)(beta)

    def direction(self) -> Float[Array, "*batch dim"] | None:
        """The target direction b when the loss depends on beta only through <b, beta>."""
        return None

    def of_margin(self, margin: Float[Array, ""]) -> Float[Array, ""]:
        """l(m), the loss at margin m = <b, beta>, for an objective of one direction b.

        By default the loss of beta = b m / |b|^2; a final class may write l itself.
        """
        b = self.direction()
        return self(b * (margin / jnp.dot(b, b)))

    @property
    def beta_dim(self) -> int | None:
        """The dimension of the beta this loss takes: the last axis of its first array
        (b, X or p; y for labels of a prompt model's outputs); None for an objective that
        does not say."""
        name = next(iter(self.core_ndim), None)
        if name not in ("b", "X", "p", "y"):
            return None
        return getattr(self, name).shape[-1]

    @property
    def batch_size(self) -> int | None:
        for name, nd in self.core_ndim.items():
            x = getattr(self, name)
            if x.ndim > nd:
                return x.shape[0]
        return None


class AbstractDataObjective(AbstractObjective):
    """L(beta) = l(X beta) over a dataset (X, y): the gradient lies in the row span of X.

    `residual(z)` is e = -grad_z l(z) in closed form, so grad L(beta) = -X^T e(X beta).
    """

    X: eqx.AbstractVar[Float[Array, "*batch samples dim"]]
    y: eqx.AbstractVar[Float[Array, "*batch samples"]]

    @abc.abstractmethod
    def residual(self, z: Float[Array, " samples"]) -> Float[Array, " samples"]:
        raise NotImplementedError

    def grad(self, beta):
        return -self.X.T @ self.residual(self.X @ beta)


class LogisticDirection(AbstractObjective):
    """L = log(1 + exp(-<b, beta>)) along a unit direction b (normalized on construction).

    grad L = -b e with the residual e(m) = sigmoid(-m) at the margin m = <b, beta>.
    """

    b: Float[Array, "*batch dim"]
    core_ndim: ClassVar[dict[str, int]] = {"b": 1}

    def __init__(self, b):
        b = finite("b", jnp.asarray(b))
        if b.ndim not in (1, 2):
            raise PolarizeError(f"`b` must have shape (dim,) or (inits, dim); got {b.shape}")
        b = refuse_if(b, lambda b, xp: xp.all(b == 0, axis=-1), "`b` must be non-zero")
        # |b| must be a float too: it under- or overflows past about 1e-154 and 1e154 (float64)
        self.b = refuse_if(
            _unit(b),
            lambda u, xp: ~xp.all(xp.isfinite(u), axis=-1) | xp.all(u == 0, axis=-1),
            "`b`'s norm under- or overflows; rescale `b` (its direction is what counts)",
        )

    def __call__(self, beta):
        return jax.nn.softplus(-jnp.dot(self.b, beta))

    def grad(self, beta):
        return -self.b * self.residual(jnp.dot(self.b, beta))

    def residual(self, margin: Float[Array, ""]) -> Float[Array, ""]:
        """e = -l'(m) for l(m) = log(1 + exp(-m))."""
        return jax.nn.sigmoid(-margin)

    def of_margin(self, margin):
        return jax.nn.softplus(-margin)

    def direction(self):
        return self.b


class LogisticData(AbstractDataObjective):
    """Mean logistic loss over a labelled dataset: mean_i log(1 + exp(-y_i <x_i, beta>)), y in {-1, +1}.

    e_i = y_i sigmoid(-y_i z_i) / n.
    """

    X: Float[Array, "*batch samples dim"]
    y: Float[Array, "*batch samples"]
    core_ndim: ClassVar[dict[str, int]] = {"X": 2, "y": 1}

    def __init__(self, X, y):
        X, y = jnp.asarray(X), jnp.asarray(y, dtype=jnp.result_type(float))
        _check_data_shapes(X, y)
        self.X = finite("X", X)
        self.y = refuse_if(
            finite("y", y), lambda y, xp: xp.abs(y) != 1, "`y` must hold labels -1 or +1 for LogisticData"
        )

    def __call__(self, beta):
        return jnp.mean(jax.nn.softplus(-self.y * (self.X @ beta)))

    def residual(self, z):
        return self.y * jax.nn.sigmoid(-self.y * z) / z.shape[-1]


#: Rows past which an SVD of the data is taken thin from its transpose: JAX's CPU SVD of
#: a tall n x d matrix holds an n x n buffer however thin the SVD asked for, and any SVD
#: without singular vectors does too (720 GB at n = 300,000 samples).
SVD_TALL_ROWS = 4096


class Square(AbstractDataObjective):
    """L = |y - X beta|^2 (X = identity when None: L = |y - beta|^2); e = 2 (y - z)."""

    X: Float[Array, "*batch samples dim"]
    y: Float[Array, "*batch samples"]
    core_ndim: ClassVar[dict[str, int]] = {"X": 2, "y": 1}

    def __init__(self, X, y):
        y = jnp.asarray(y)
        if X is None:
            X = jnp.broadcast_to(jnp.eye(y.shape[-1], dtype=y.dtype), y.shape[:-1] + y.shape[-1:] * 2)
        X = jnp.asarray(X)
        _check_data_shapes(X, y)
        self.X, self.y = finite("X", X), finite("y", y)

    def __call__(self, beta):
        return jnp.sum(jnp.square(self.y - self.X @ beta))

    def residual(self, z):
        return 2 * (self.y - z)

    def curvature(self) -> Array:
        """The largest Hessian eigenvalue of L in beta: 2 sigma_max(X)^2 (over a batch: the largest)."""
        n, dim = self.X.shape[-2:]
        if n > max(dim, SVD_TALL_ROWS):  # the thin SVD of X^T: no n x n buffer
            sv = jnp.linalg.svd(jnp.swapaxes(self.X, -1, -2), full_matrices=False)[1]
        else:
            sv = jnp.linalg.svd(self.X, compute_uv=False)
        return 2 * jnp.max(sv) ** 2


class CrossEntropy(AbstractObjective):
    """L = -sum_k p_k log softmax(beta)_k for a target distribution p over dim classes.

    grad L = softmax(beta) sum(p) - p.
    """

    p: Float[Array, "*batch dim"]
    core_ndim: ClassVar[dict[str, int]] = {"p": 1}

    def __init__(self, p):
        p = finite("p", jnp.asarray(p))
        if p.ndim not in (1, 2):
            raise PolarizeError(f"`p` must have shape (dim,) or (inits, dim); got {p.shape}")
        bad = lambda p, xp: xp.any(p < 0) | ~xp.isclose(p.sum(-1), 1.0, atol=1e-6)
        self.p = refuse_if(p, bad, "`p` must be a probability vector (non-negative, summing to 1)")

    def __call__(self, beta):
        return -jnp.sum(self.p * jax.nn.log_softmax(beta))

    def grad(self, beta):
        return jax.nn.softmax(beta) * jnp.sum(self.p) - self.p

    def curvature(self) -> Array:
        """A bound on the largest Hessian eigenvalue of L in beta: sum(p) (diag(q) - q q^T) has
        eigenvalues at most sum(p) / 2 for any softmax q."""
        return 0.5 * jnp.max(jnp.sum(self.p, axis=-1))


@jax.jit
def _unit(b):
    """b / |b| along the last axis, as one program (two op by op: ~25 ms more in a fresh process)."""
    return b / jnp.linalg.norm(b, axis=-1, keepdims=True)


def _check_data_shapes(X, y) -> None:
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
    if n > max(dim, SVD_TALL_ROWS):
        # from G^T = W diag U^T (`SVD_TALL_ROWS`): X = U diag(sv) W^T is the same matrix to
        # rounding (a singular pair's common sign flip cancels in it)
        W, _, Ut = jnp.linalg.svd(G.T, full_matrices=False)
        U, Wt = Ut.T, W.T
    else:
        U, _, Wt = jnp.linalg.svd(G, full_matrices=False)
    sv = jnp.linspace(1.0, 1.0 / kappa, min(n, dim))
    X = (U * sv[None, :]) @ Wt
    return Square(X, jax.random.normal(ky, (n,)))


def random_labels(key: PRNGKeyArray | int, n: int, dim: int) -> LogisticData:
    """LogisticData with Gaussian inputs labelled by a random teacher: y = sign(<w, x>)."""
    n = check_positive("n", n, integer=True)
    dim = check_positive("dim", dim, integer=True)
    kx, kw = jax.random.split(as_key(key))
    X = jax.random.normal(kx, (n, dim))
    return LogisticData(X, _teacher_labels(X, jax.random.normal(kw, (dim,))))


@jax.jit
def _teacher_labels(X, w):
    """sign(<w, x>) of each row, +-1, as one program (op by op: four small compiles)."""
    return jnp.where(X @ w >= 0, 1.0, -1.0)


def peaked_distribution(key: PRNGKeyArray | int, dim: int, sharpness: float = 10.0) -> CrossEntropy:
    """CrossEntropy with the paper's target p = softmax(sharpness * U[0, 1])."""
    dim = check_positive("dim", dim, integer=True)
    # op by op: fused into one program, the softmax rounds otherwise in the last bit
    return CrossEntropy(jax.nn.softmax(sharpness * jax.random.uniform(as_key(key), (dim,))))
