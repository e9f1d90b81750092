"""Draws hashed on the host (`core._host_draws`) against Threefry's published answers and
`jax.random`'s own draws, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core import _host_draws
from polarize.core._host_draws import host_normal, host_normals, host_stream, threefry2x32
from polarize.core._models import _jitted_normals, as_key, standard_normals


def test_the_hash_is_threefry_2x32_20():
    # the known-answer vectors of Salmon et al.'s Random123 (kat_vectors, threefry2x32_20)
    cases = [
        ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ]
    for key, count, expected in cases:
        k = [np.uint32(x) for x in key]
        out = threefry2x32(*k, *[np.array([x], np.uint32) for x in count])
        assert [int(x[0]) for x in out] == list(expected)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", [(8, 8), (3, 5), (1, 1)])
def test_an_ensembles_draws_are_jax_randoms_bit_for_bit(shape, dtype):
    for seed, start in ((0, 0), (12345, 5), (2**31 + 7, 2**32 - 40)):
        key, start = as_key(seed), jnp.asarray(start, jnp.uint32)
        want = _jitted_normals(key, start, n=40, shape=shape, dtype=jnp.dtype(dtype))
        got = host_normals(key, start, n=40, shape=shape, dtype=jnp.dtype(dtype))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


def test_streams_and_single_draws_are_jax_randoms():
    for seed, i in ((0, 1), (7, 2), (2**31 - 1, 77)):
        key = jax.random.fold_in(jax.random.key(seed), i)
        np.testing.assert_array_equal(host_stream(seed, i), jax.random.key_data(key))
        for shape, dtype in (((3,), "float64"), ((4, 5), "float32")):
            want = jax.random.normal(key, shape, dtype)
            got = host_normal(host_stream(seed, i), shape, dtype)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="seed"):
        host_stream(2**31, 1)


def test_init_ensemble_is_the_same_drawn_on_the_host_traced_or_large(monkeypatch):
    host = pz.init_ensemble(3, 50, tokens=6, dim=4, a_scale=0.5, start=9)
    traced = jax.jit(
        lambda k: standard_normals(k, jnp.asarray(9, jnp.uint32), n=50, shape=(4, 6), dtype="float64")
    )
    V, a = traced(as_key(3))  # under jit the key is traced: jax.random's program
    np.testing.assert_array_equal(host.V, 0.1 * V)
    np.testing.assert_array_equal(host.a, 0.5 * a)
    monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", 0)  # too large for the host
    big = pz.init_ensemble(3, 50, tokens=6, dim=4, a_scale=0.5, start=9)
    np.testing.assert_array_equal(big.V, host.V)
    np.testing.assert_array_equal(big.a, host.a)
