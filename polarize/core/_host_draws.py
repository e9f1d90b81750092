"""`jax.random.normal`'s draws of a few initializations, their random bits hashed on the host.

JAX's Threefry-2x32 compiles on CPU as a loop of 20 rounds per hash: the program that
draws an ensemble took 0.7 s to compile, most of a notebook's first `init_ensemble`,
to make about 20 ms of numbers. The hash is integer arithmetic (additions modulo 2^32,
rotations, xors), so numpy computes the same bits exactly; the map from bits to a
uniform number is exact too (a mantissa fill, a subtraction of 1, a doubling and one
rounded addition); only the inverse error function stays in JAX, as the same
operations `jax.random.normal` applies (one small program for every shape).

`host_normals` gives the N(0, 1) draws of `standard_normals` bit for bit (the tests
compare them with `jax.random` over many keys, shapes and both dtypes); it covers
JAX's default, "partitionable" Threefry and float32 or float64, and is used where the
hashing costs less than a compile (`HOST_MAX_HASHES`).

The draws reach JAX by `jax.device_put`: `jnp.asarray` of a numpy array compiles a
program per shape (about 12 ms each in a fresh process), to copy the same numbers.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: Draws of at most this many Threefry hashes (one per number, plus three per init for its
#: keys) are hashed on the host: about 10 ms per 10^5 hashes there, against the 0.7 s
#: compile of the jitted draw that a larger ensemble amortizes.
HOST_MAX_HASHES = 2**18

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def host_drawable(key, start, n: int, shape: tuple, dtype) -> bool:
    """Whether `host_normals` reproduces these draws and is the cheaper way to them
    (`key` a JAX key, or None for key data of Threefry by construction)."""
    if isinstance(start, jax.core.Tracer) or not (key is None or _hostable(key)):
        return False
    return host_cheaper(n * (int(np.prod(shape)) + int(np.prod(shape[1:])) + 3), dtype)


def host_cheaper(hashes: int, dtype) -> bool:
    """Whether `hashes` Threefry hashes of numbers of `dtype` are drawn on the host."""
    return (
        hashes <= HOST_MAX_HASHES
        and jax.default_backend() == "cpu"
        and bool(jax.config.jax_threefry_partitionable)
        and np.dtype(dtype) in (np.float32, np.float64)
    )


def host_seed(seed) -> bool:
    """Whether the keys of `jax.random.key(seed)` are derived on the host: an int seed in
    [0, 2^31) under JAX's default Threefry implementation, whose key is then (0, seed)."""
    return (
        isinstance(seed, int | np.integer)
        and not isinstance(seed, bool)
        and 0 <= seed < 2**31
        and str(jax.config.jax_default_prng_impl) == "threefry2x32"
    )


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) of counters (x1, x2) under keys (k1, k2), as JAX's."""
    with np.errstate(over="ignore"):
        ks = (k1, k2, k1 ^ k2 ^ _PARITY)
        x1, x2 = x1 + ks[0], x2 + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x1 = x1 + x2
                x2 = (x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r))
                x2 = x1 ^ x2
            x1 = x1 + ks[(i + 1) % 3]
            x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def host_normals(key, start, *, n: int, shape: tuple, dtype) -> tuple:
    """`standard_normals(key, start, n=n, shape=shape, dtype=dtype)`: (V, a) of shapes
    (n, *shape) and (n, *shape[1:]), the draws of initializations start .. start + n - 1.
    `key`: a JAX key or its data (two uint32)."""
    k1, k2 = _init_keys(key, start, n)
    # split(key_i) -> (kv, ka): the hashes of the counters (0, 0) and (0, 1)
    zero, one = np.zeros(n, np.uint32), np.ones(n, np.uint32)
    kv, ka = threefry2x32(k1, k2, zero, zero), threefry2x32(k1, k2, zero, one)
    sizes = (int(np.prod(shape)), int(np.prod(shape[1:])))
    bits = [_bits(key, size, dtype) for key, size in zip((kv, ka), sizes)]
    z = _normal_of(_uniform(np.concatenate([b.ravel() for b in bits]), dtype))
    V, a = z[: n * sizes[0]], z[n * sizes[0] :]
    return jax.device_put(V.reshape(n, *shape)), jax.device_put(a.reshape(n, *shape[1:]))


def host_normals_per_init(key, start, *, n: int, shape: tuple, dtype):
    """`jax.vmap(lambda k: jax.random.normal(k, shape, dtype))(init_keys(key, n, start))`:
    shape (n, *shape), initialization i from fold_in(key, start + i). `key`: a JAX key or
    its data (two uint32)."""
    z = _normal_of(_uniform(_bits(_init_keys(key, start, n), int(np.prod(shape)), dtype).ravel(), dtype))
    return jax.device_put(z.reshape(n, *shape))


def per_init_drawable(key, start, n: int, shape: tuple, dtype) -> bool:
    """Whether `host_normals_per_init` reproduces these draws and is the cheaper way to
    them: `key` a seed the host derives (`host_seed`) or a concrete Threefry key, `start`
    a concrete integer."""
    key = seed_or_key(key)
    if not isinstance(key, np.ndarray | jax.Array) or not isinstance(start, int | np.integer):
        return False
    return _hostable(key) and host_cheaper(n * (int(np.prod(shape)) + 1), dtype)


def host_normal(key, shape: tuple, dtype):
    """`jax.random.normal(key, shape, dtype)` (`key` a JAX key or its data)."""
    k = _data(key)
    bits = _bits((k[:1], k[1:]), int(np.prod(shape)), dtype)
    return jax.device_put(_normal_of(_uniform(bits.ravel(), dtype)).reshape(shape))


def seed_or_key(key):
    """`key` for `normal` and `split`: a seed the host derives (`host_seed`) as the data of
    `jax.random.key(seed)` (the counter-free key (0, seed)), anything else unchanged (a
    concrete 0-d integer array is read as the seed it holds)."""
    dtype = getattr(key, "dtype", None)
    scalar = dtype is not None and np.ndim(key) == 0 and not isinstance(key, jax.core.Tracer)
    if scalar and jnp.issubdtype(dtype, jnp.integer):
        key = int(key)
    return np.array([0, key], np.uint32) if host_seed(key) else key


def _hostable(key) -> bool:
    """Whether `key` is the data of a Threefry key (uint32 numpy) or a concrete Threefry JAX key."""
    if isinstance(key, np.ndarray):
        return key.dtype == np.uint32 and key.shape == (2,)
    if isinstance(key, jax.core.Tracer) or not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return False
    return key.shape == () and str(jax.random.key_impl(key)) == "threefry2x32"


def _as_jax_key(key):
    """A JAX key of key data (Threefry's, by construction), a key unchanged."""
    return jax.random.wrap_key_data(key, impl="threefry2x32") if isinstance(key, np.ndarray) else key


def normal(key, shape: tuple, dtype=None):
    """`jax.random.normal(key, shape, dtype)`, hashed on the host where that gives the same
    bits and is cheaper (`host_cheaper`). `key`: a JAX key, or key data from `seed_or_key`
    or `split`."""
    dtype = np.dtype(dtype or jax.numpy.result_type(float))
    if _hostable(key) and host_cheaper(int(np.prod(shape)), dtype):
        return host_normal(key, shape, dtype)
    return jax.random.normal(_as_jax_key(key), shape, dtype)


def split(key, num: int = 2) -> list:
    """`jax.random.split(key, num)` as a list of keys: on the host (key data, the hashes of
    the counters (0, i)) where `normal` would draw on the host, else JAX keys."""
    if _hostable(key) and host_cheaper(num, np.float64):
        k = _data(key)
        k1, k2 = threefry2x32(k[0], k[1], np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
        return [np.array([a, b], np.uint32) for a, b in zip(k1, k2)]
    return list(jax.random.split(_as_jax_key(key), num))


def host_stream(seed: int, i: int) -> np.ndarray:
    """The data of fold_in(jax.random.key(seed), i) for a seed in [0, 2^31): key(seed) is
    the counter-free key (0, seed), folding in i hashes the counter (0, i)."""
    if not host_seed(seed):
        raise ValueError(f"host_stream: seed {seed} is not one the host derives (`host_seed`)")
    zero = np.zeros(1, np.uint32)
    k1, k2 = threefry2x32(np.uint32(0), np.uint32(seed), zero, np.full(1, i, np.uint32))
    return np.concatenate([k1, k2])


def _init_keys(key, start, n: int) -> tuple:
    """The data (k1, k2) of key_i = fold_in(key, start + i), i < n: the hashes of the
    counters (0, start + i)."""
    k = _data(key)
    index = np.asarray(start, np.uint32) + np.arange(n, dtype=np.uint32)
    return threefry2x32(k[0], k[1], np.zeros(n, np.uint32), index)


def _data(key) -> np.ndarray:
    if isinstance(key, np.ndarray) and key.dtype == np.uint32:
        return key
    return np.asarray(jax.random.key_data(key), np.uint32)


def _bits(key, size: int, dtype):
    """`jax.random.bits` of `size` numbers per key (keys (k1, k2) of shape (n,)), as the
    uint of `dtype`'s width: counter j is (0, j); 64 bits are hi << 32 | lo, 32 are hi ^ lo."""
    k1, k2 = key
    counts = np.broadcast_to(np.arange(size, dtype=np.uint32), (k1.shape[0], size))
    hi, lo = threefry2x32(k1[:, None], k2[:, None], np.zeros_like(counts), counts)
    if np.dtype(dtype).itemsize == 8:
        return (hi.astype(np.uint64) << np.uint64(32)) | lo.astype(np.uint64)
    return hi ^ lo


def _uniform(bits, dtype):
    """`jax.random.uniform(minval=nextafter(-1, 0), maxval=1)` of these bits: the mantissa
    filled with the top bits (a number in [1, 2)), minus 1, times (maxval - minval) = 2
    (exact), plus minval (one rounding, as XLA's)."""
    dtype = np.dtype(dtype)
    info = np.finfo(dtype)
    uint = bits.dtype.type
    lo = np.nextafter(dtype.type(-1.0), dtype.type(0.0))
    width = dtype.type(1.0) - lo  # 2 - ulp rounds to 2 in `dtype`, as in XLA
    filled = (bits >> uint(info.bits - info.nmant)) | np.array(1.0, dtype).view(bits.dtype)
    floats = filled.view(dtype) - dtype.type(1.0)
    return np.maximum(lo, floats * width + lo)


#: Uniforms mapped to normals per call of the jitted map: every draw's numbers go through
#: one program of this length (padded), so a fresh process compiles it once per dtype, not
#: once per shape (an ensemble's and a direction's draws: ~45 ms each).
NORMAL_CHUNK = 1 << 14


def _normal_of(u: np.ndarray) -> np.ndarray:
    """sqrt(2) erfinv(u) of a 1-d host array, elementwise, by `_inverse_erf` in chunks."""
    n = u.shape[0]
    if n == 0:  # an empty draw (jax.random's is one too), which no chunk would hold
        return np.empty(0, u.dtype)
    padded = np.zeros(-(-n // NORMAL_CHUNK) * NORMAL_CHUNK, u.dtype)
    padded[:n] = u
    parts = [_inverse_erf(padded[i : i + NORMAL_CHUNK]) for i in range(0, padded.shape[0], NORMAL_CHUNK)]
    return np.concatenate([np.asarray(x) for x in parts])[:n]


@jax.jit
def _inverse_erf(u):
    """sqrt(2) erfinv(u), as `jax.random.normal` computes it."""
    return lax.mul(np.array(np.sqrt(2), u.dtype), lax.erf_inv(u))
