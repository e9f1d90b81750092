"""Normalizations sigma: R^T -> R^T that turn attention logits into weights.

Each acts along the last axis, so it works on one logit vector, on a batch, and
under `jax.vmap`. Besides `__call__` each provides `vjp(a, c) = J_sigma(a)^T c`
in closed form: the gradient flow needs exactly this product
(`da/dt = J^T V^T r`), and the closed form is cheaper than autodiff.

Zero denominators (relu-norm with every logit <= 0, l1/square-norm at a = 0,
sum-norm with sum(a) = 0) follow one documented convention: the weights are
uniform, 1/T, and the Jacobian there is zero. No NaN is ever produced.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from ._choices import NORMALIZATION_NAMES
from ._errors import PolarizeError, check_choice
from ._refuse import refuse_if, shown


class AbstractNormalization(eqx.Module):
    """sigma(a) along the last axis, with its Jacobian-transpose product."""

    #: True when the weights always lie on the probability simplex.
    simplex: ClassVar[bool] = True

    def __call__(self, a: Float[Array, "... tokens"]) -> Float[Array, "... tokens"]:
        raise NotImplementedError

    def vjp(self, a: Float[Array, "... tokens"], c: Float[Array, "... tokens"]) -> Float[Array, "... tokens"]:
        """J_sigma(a)^T c, in closed form."""
        raise NotImplementedError


def _dot(x, y):
    return jnp.sum(x * y, axis=-1, keepdims=True)


def _ratio(h, dh):
    """p = h(a) / sum h(a) and its vjp (J^T c)_j = h'(a_j) (c_j - <p, c>) / D.

    A zero denominator gives uniform weights and a zero Jacobian (documented above);
    the double `where` keeps the gradient finite there too.
    """

    def call(a):
        ha = h(a)
        den = jnp.sum(ha, axis=-1, keepdims=True)
        zero = den == 0
        safe = jnp.where(zero, 1.0, den)
        return jnp.where(zero, 1.0 / a.shape[-1], ha / safe)

    def vjp(a, c):
        ha = h(a)
        den = jnp.sum(ha, axis=-1, keepdims=True)
        zero = den == 0
        safe = jnp.where(zero, 1.0, den)
        p = ha / safe
        return jnp.where(zero, 0.0, dh(a) * (c - _dot(p, c)) / safe)

    return call, vjp


def _positive(name: str, value):
    """`value` if a positive finite number, else refused (under jit too, see `refuse_if`)."""
    if isinstance(value, bool) or not (isinstance(value, int | float) or getattr(value, "shape", None) == ()):
        raise PolarizeError(f"`{name}` must be a positive finite number (a scalar); got {shown(value)}")
    bad = lambda x, xp: ~(xp.isfinite(x) & (xp.asarray(x) > 0))
    return refuse_if(value, bad, f"`{name}` must be a positive finite number; got {shown(value)}")


def _finite(name: str, value):
    """`value` if finite, else refused (under jit too, see `refuse_if`)."""
    return refuse_if(
        value, lambda x, xp: ~xp.isfinite(x), f"`{name}` must be a finite number; got {shown(value)}"
    )


class Softmax(AbstractNormalization):
    """s = softmax(a / temperature); J^T c = s (c - <s, c>) / temperature."""

    temperature: Float[ArrayLike, ""]

    def __init__(self, temperature: Float[ArrayLike, ""] = 1.0):
        self.temperature = _positive("temperature", temperature)

    def __call__(self, a):
        return jax.nn.softmax(a / self.temperature, axis=-1)

    def vjp(self, a, c):
        s = self(a)
        return s * (c - _dot(s, c)) / self.temperature


class Softmax1(AbstractNormalization):
    """s_i = exp(a_i) / (exp(sink) + sum_j exp(a_j)): softmax with an extra sink slot.

    The slot's weight is dropped, so the weights sum to less than one; sink = 0 is
    "softmax plus one". J^T c = s (c - <s, c>).
    """

    sink: Float[ArrayLike, ""]
    simplex: ClassVar[bool] = False

    def __init__(self, sink: Float[ArrayLike, ""] = 0.0):
        self.sink = _finite("sink", sink)

    def __call__(self, a):
        sink = jnp.broadcast_to(jnp.asarray(self.sink, a.dtype), a.shape[:-1] + (1,))
        return jax.nn.softmax(jnp.concatenate([a, sink], axis=-1), axis=-1)[..., :-1]

    def vjp(self, a, c):
        s = self(a)
        return s * (c - _dot(s, c))


class Sigmoid(AbstractNormalization):
    """Elementwise s = sigmoid(a), not normalized: no competition between tokens."""

    simplex: ClassVar[bool] = False

    def __call__(self, a):
        return jax.nn.sigmoid(a)

    def vjp(self, a, c):
        s = jax.nn.sigmoid(a)
        return s * (1 - s) * c


class Relu(AbstractNormalization):
    """Elementwise s = relu(a), not normalized."""

    simplex: ClassVar[bool] = False

    def __call__(self, a):
        return jax.nn.relu(a)

    def vjp(self, a, c):
        return jnp.where(a > 0, c, 0.0)


class Linear(AbstractNormalization):
    """The identity s = a: attention without any nonlinearity."""

    simplex: ClassVar[bool] = False

    def __call__(self, a):
        return a

    def vjp(self, a, c):
        return c


_relu_norm = _ratio(jax.nn.relu, lambda a: (a > 0).astype(a.dtype))
_sum_norm = _ratio(lambda a: a, jnp.ones_like)
_l1_norm = _ratio(jnp.abs, jnp.sign)
_square_norm = _ratio(jnp.square, lambda a: 2 * a)
_sigmoid_norm = _ratio(jax.nn.sigmoid, lambda a: jax.nn.sigmoid(a) * jax.nn.sigmoid(-a))


class ReluNorm(AbstractNormalization):
    """s = relu(a) / sum relu(a) (uniform when every logit is <= 0)."""

    def __call__(self, a):
        return _relu_norm[0](a)

    def vjp(self, a, c):
        return _relu_norm[1](a, c)


class SumNorm(AbstractNormalization):
    """s = a / sum a: sums to one but can be negative; uniform when sum a = 0."""

    simplex: ClassVar[bool] = False

    def __call__(self, a):
        return _sum_norm[0](a)

    def vjp(self, a, c):
        return _sum_norm[1](a, c)


class L1Norm(AbstractNormalization):
    """s = |a| / sum |a| (uniform at a = 0)."""

    def __call__(self, a):
        return _l1_norm[0](a)

    def vjp(self, a, c):
        return _l1_norm[1](a, c)


class SquareNorm(AbstractNormalization):
    """s = a^2 / sum a^2 (uniform at a = 0)."""

    def __call__(self, a):
        return _square_norm[0](a)

    def vjp(self, a, c):
        return _square_norm[1](a, c)


class SigmoidNorm(AbstractNormalization):
    """s = sigmoid(a) / sum sigmoid(a)."""

    def __call__(self, a):
        return _sigmoid_norm[0](a)

    def vjp(self, a, c):
        return _sigmoid_norm[1](a, c)


class Sparsemax(AbstractNormalization):
    """Euclidean projection of a onto the simplex (Martins & Astudillo, 2016).

    s = relu(a - tau(a)); on the support S, J^T c = c - mean_S(c), zero elsewhere.
    """

    def __call__(self, a):
        return jax.nn.relu(a - _sparsemax_threshold(a))

    def vjp(self, a, c):
        support = (a > _sparsemax_threshold(a)).astype(a.dtype)
        mean = _dot(support, c) / jnp.sum(support, axis=-1, keepdims=True)
        return support * (c - mean)


def _sparsemax_threshold(a):
    z = jnp.flip(jnp.sort(a, axis=-1), axis=-1)
    k = jnp.broadcast_to(jnp.arange(1, a.shape[-1] + 1, dtype=a.dtype), a.shape)
    cumsum = jnp.cumsum(z, axis=-1)
    in_support = 1 + k * z > cumsum
    size = jnp.sum(in_support, axis=-1, keepdims=True)
    total = jnp.take_along_axis(cumsum, size.astype(jnp.int32) - 1, axis=-1)
    return (total - 1) / size.astype(a.dtype)


NORMALIZATIONS: dict[str, type[AbstractNormalization]] = {
    "softmax": Softmax,
    "sigmoid": Sigmoid,
    "relu": Relu,
    "linear": Linear,
    "relu-norm": ReluNorm,
    "sum-norm": SumNorm,
    "l1-norm": L1Norm,
    "square-norm": SquareNorm,
    "sigmoid-norm": SigmoidNorm,
    "softmax1": Softmax1,
    "sparsemax": Sparsemax,
}
assert tuple(NORMALIZATIONS) == NORMALIZATION_NAMES, "the registry holds the names the CLI checks"


def normalization(name: str | AbstractNormalization, **options) -> AbstractNormalization:
    """The normalization registered under `name` (see `NORMALIZATIONS`).

    Options go to its constructor: `normalization("softmax", temperature=0.5)`,
    `normalization("softmax1", sink=0.0)`.
    """
    if isinstance(name, AbstractNormalization):
        if options:
            raise PolarizeError("options can only be given together with a normalization name")
        return name
    cls = NORMALIZATIONS[check_choice("norm", name, NORMALIZATIONS)]
    try:
        return cls(**options)
    except TypeError:
        fields = [f for f in getattr(cls, "__dataclass_fields__", {})]
        raise PolarizeError(
            f"normalization {name!r} takes options {fields or 'none'}; got {sorted(options)}"
        ) from None
