"""Attention models stripped to their core: beta = V sigma(a) and the tied beta = U sigma(U a).

A model holds either one initialization or a leading batch axis of them; every
entry point (`flow`, `descend`, `summarize`) accepts both.
"""

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from ._errors import PolarizeError, check_positive
from ._normalizations import AbstractNormalization, Softmax, normalization
from ._refuse import refuse_if


def finite(name: str, x: Array) -> Array:
    """`x`, refused when it holds NaN or Inf (also under jit: see `refuse_if`)."""
    return refuse_if(x, lambda x, xp: ~xp.isfinite(x), f"`{name}` contains NaN or Inf")


class AbstractModel(eqx.Module):
    """A single-query attention head: weights sigma(logits), output values @ weights.

    `trainable` names the arrays that gradient flow moves; `core_ndim` gives their
    rank for one initialization (one more means a leading batch axis).
    """

    norm: eqx.AbstractVar[AbstractNormalization]
    trainable: ClassVar[tuple[str, ...]]
    core_ndim: ClassVar[dict[str, int]]

    def logits(self) -> Float[Array, "*batch tokens"]:
        raise NotImplementedError

    def values(self) -> Float[Array, "*batch dim tokens"]:
        raise NotImplementedError

    def weights(self) -> Float[Array, "*batch tokens"]:
        """s = sigma(logits)."""
        return self.norm(self.logits())

    def __call__(self) -> Float[Array, "*batch dim"]:
        """beta = values @ weights."""
        return jnp.einsum("...dt,...t->...d", self.values(), self.weights())

    @property
    def batch_size(self) -> int | None:
        """Number of initializations held, or None for a single one."""
        name = self.trainable[0]
        x = getattr(self, name)
        return x.shape[0] if x.ndim > self.core_ndim[name] else None

    @property
    def tokens(self) -> int:
        return self.logits().shape[-1]

    def at_state(self, values, logits) -> "AbstractModel":
        """The model at a saved state (what a `Trajectory` keeps as V and a at one time)."""
        return with_params(self, (values, logits))


class ValueAttention(AbstractModel):
    """beta = V sigma(a), with V of shape (dim, tokens) and a of shape (tokens,).

    Column v_j of V is token j's value and a its attention logit. Gradient flow
    on L(beta) gives dV/dt = r s^T and da/dt = J_sigma^T V^T r with r = -grad L.
    """

    V: Float[Array, "*batch dim tokens"]
    a: Float[Array, "*batch tokens"]
    norm: AbstractNormalization = eqx.field(default_factory=Softmax)
    trainable: ClassVar[tuple[str, ...]] = ("V", "a")
    core_ndim: ClassVar[dict[str, int]] = {"V": 2, "a": 1}

    def __init__(self, V, a, norm: AbstractNormalization | str = "softmax"):
        self.V = finite("V", jnp.asarray(V))
        self.a = finite("a", jnp.asarray(a))
        self.norm = normalization(norm)

    def __check_init__(self):
        if self.V.ndim not in (2, 3):
            raise PolarizeError(
                f"`V` must have shape (dim, tokens) or (inits, dim, tokens); got {self.V.shape}"
            )
        if self.a.shape != self.V.shape[:-2] + self.V.shape[-1:]:
            raise PolarizeError(
                f"`a` must have shape {self.V.shape[:-2] + self.V.shape[-1:]} to match "
                f"`V` of shape {self.V.shape}; got {self.a.shape}"
            )

    def logits(self):
        return self.a

    def values(self):
        return self.V


class TiedValueAttention(AbstractModel):
    """beta = U sigma(U a): the values and the logits share one square matrix U.

    With U(0) = I the column of U at the winning token grows far above the others:
    the value-softmax picture of a massive activation.
    """

    U: Float[Array, "*batch dim dim"]
    a: Float[Array, "*batch dim"]
    norm: AbstractNormalization = eqx.field(default_factory=Softmax)
    trainable: ClassVar[tuple[str, ...]] = ("U", "a")
    core_ndim: ClassVar[dict[str, int]] = {"U": 2, "a": 1}

    def __init__(self, U, a, norm: AbstractNormalization | str = "softmax"):
        self.U = finite("U", jnp.asarray(U))
        self.a = finite("a", jnp.asarray(a))
        self.norm = normalization(norm)

    def __check_init__(self):
        if self.U.ndim not in (2, 3) or self.U.shape[-1] != self.U.shape[-2]:
            raise PolarizeError(
                f"`U` must be square, shape (dim, dim) or (inits, dim, dim); got {self.U.shape}"
            )
        if self.a.shape != self.U.shape[:-1]:
            raise PolarizeError(f"`a` must have shape {self.U.shape[:-1]} to match `U`; got {self.a.shape}")

    def logits(self):
        return jnp.einsum("...ij,...j->...i", self.U, self.a)

    def values(self):
        return self.U


def params(model: AbstractModel) -> tuple:
    """The trainable arrays of `model`, in `model.trainable` order."""
    return tuple(getattr(model, name) for name in model.trainable)


def with_params(model: AbstractModel, values) -> AbstractModel:
    """`model` with its trainable arrays replaced by `values`."""
    return eqx.tree_at(lambda m: [getattr(m, n) for n in m.trainable], model, list(values))


def as_key(key: PRNGKeyArray | int) -> PRNGKeyArray:
    """A typed PRNG key from an int seed (a Python, numpy or JAX integer, traced too), an
    existing key, or the uint32 data of one (`jax.random.PRNGKey(seed)`)."""
    dtype = getattr(key, "dtype", None)
    if isinstance(key, int | np.integer) and not isinstance(key, bool):
        return jax.random.key(int(key))
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return key
    if dtype is not None and jnp.issubdtype(dtype, jnp.integer) and np.ndim(key) == 0:
        return jax.random.key(key)
    if dtype == np.uint32 and np.ndim(key) >= 1:
        return jax.random.wrap_key_data(jnp.asarray(key))
    got = f"a {type(key).__name__}" if dtype is None else f"an array of {dtype} and shape {np.shape(key)}"
    raise PolarizeError(
        f"`key` must be an int seed, a JAX key (jax.random.key(seed)) or the uint32 data of one; got {got}"
    )


def init_keys(key: PRNGKeyArray | int, n: int, start: int = 0) -> PRNGKeyArray:
    """The keys of initializations start, ..., start + n - 1: key_i = fold_in(key, i)."""
    n = check_positive("n", n, integer=True)
    return _keys(as_key(key), first_index(start, n), n)


def first_index(start, n: int) -> Array:
    """`start` checked (initialization indices are 32-bit: start + n <= 2^32), as uint32."""
    if not isinstance(start, int | np.integer) or not 0 <= start <= 2**32 - n:
        raise PolarizeError(f"`start` must be an integer in [0, 2^32 - n] (n = {n}); got {start!r}")
    return jax.device_put(np.uint32(start))  # no program: jnp.asarray compiles one


def _keys(key, start, n: int):
    """`init_keys` for a uint32 `start` (traced or not) and a static n."""
    index = start + jnp.arange(n, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, index)


def init_ensemble(
    key: PRNGKeyArray | int,
    n: int,
    *,
    tokens: int,
    dim: int,
    v_scale: float = 0.1,
    a_scale: float = 0.0,
    a_offset: float = 0.0,
    norm: AbstractNormalization | str = "softmax",
    start: int = 0,
    dtype=None,
) -> ValueAttention:
    """n initializations V ~ v_scale N(0, 1), a ~ a_offset + a_scale N(0, 1).

    Initialization i (counted from `start`) depends only on (key, i), so it is the
    same whatever n, the chunking or the device count.
    """
    n = check_positive("n", n, integer=True)
    tokens = check_positive("tokens", tokens, integer=True)
    dim = check_positive("dim", dim, integer=True)
    dtype = jnp.dtype(dtype or jnp.result_type(float))
    for name, value in (("v_scale", v_scale), ("a_scale", a_scale), ("a_offset", a_offset)):
        if not np.isfinite(value):
            raise PolarizeError(f"`{name}` must be finite; got {value!r}")
    start = first_index(start, n)  # traced: one compiled draw for every chunk
    V, a = standard_normals(as_key(key), start, n=n, shape=(dim, tokens), dtype=dtype)
    # scaled op by op, outside the draw's program: fused there, XLA rounds a + s x differently
    V, a = _scaled(V, v_scale), _scaled(_scaled(a, a_scale), a_offset, add=True)
    return ValueAttention(V, a, normalization(norm))


def _scaled(x, s: float, *, add: bool = False):
    """s x (s + x with `add`), one correctly rounded operation per element: in numpy where
    `x` is a float32 or float64 array in host memory (the same bits as XLA's, without a
    program to compile and load: a fresh process paid ~25 ms for each), else in JAX."""
    if jnp.dtype(x.dtype) in (jnp.float32, jnp.float64) and _on_cpu(x):
        host = np.asarray(x)
        return jax.device_put(host + host.dtype.type(s) if add else host * host.dtype.type(s))
    return s + x if add else s * x


def _on_cpu(x) -> bool:
    return not isinstance(x, jax.core.Tracer) and all(d.platform == "cpu" for d in x.devices())


@functools.partial(jax.jit, static_argnames=("n", "shape", "dtype"))
def standard_normals(key, start, *, n, shape, dtype):
    """The N(0, 1) draws of initializations start .. start + n - 1: (V of shape (n, *shape),
    a of shape (n, *shape[1:])), initialization i from the keys split off fold_in(key, i).
    One program (drawn op by op they cost ~5 ms per 1024 initializations)."""

    def one(k):
        kv, ka = jax.random.split(k)
        return jax.random.normal(kv, shape, dtype), jax.random.normal(ka, shape[1:], dtype)

    return jax.vmap(one)(_keys(key, start, n))
