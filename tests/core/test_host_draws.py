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
from polarize.core._times import check_times
from polarize.solve._options import Targets


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


def test_draws_of_any_shape_share_one_normal_program(compiles):
    """Uniforms become normals in fixed-length chunks (`NORMAL_CHUNK`): a draw longer than
    one chunk is still jax.random's, bit for bit, and a draw of a new shape compiles nothing."""
    key, start = as_key(3), jnp.asarray(0, jnp.uint32)
    n = _host_draws.NORMAL_CHUNK // 64 + 7  # V and a: two chunks and a padded third
    want = _jitted_normals(key, start, n=n, shape=(8, 8), dtype=jnp.dtype("float64"))
    host_normals(key, start, n=2, shape=(3, 2), dtype=jnp.dtype("float64"))  # the program, compiled
    got, compiled = compiles.counting(host_normals, key, start, n=n, shape=(8, 8), dtype=jnp.dtype("float64"))
    assert "jit(_inverse_erf)" not in compiled
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    empty = host_normal(host_stream(3, 0), (0, 4), "float64")  # no chunk at all
    assert empty.shape == (0, 4) and empty.dtype == jnp.float64


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


def test_an_int_seeds_ensemble_derives_no_jax_key(monkeypatch):
    # the seed's key data comes from the host; jax.random.key(seed) would compile a program
    want = pz.init_ensemble(jax.random.key(7), 20, tokens=3, dim=5, a_scale=1.0)

    def refused(*args, **kwargs):
        raise AssertionError("jax.random.key was called")

    monkeypatch.setattr(jax.random, "key", refused)
    got = pz.init_ensemble(7, 20, tokens=3, dim=5, a_scale=1.0)
    np.testing.assert_array_equal(got.V, want.V)
    np.testing.assert_array_equal(got.a, want.a)


def test_host_numbers_reach_jax_without_a_copy_program(compiles):
    # draws, times and targets made on the host reach JAX by device_put: jnp.asarray of them
    # compiles a program per shape. Shapes no other test uses, so that no program is cached;
    # the normal draw's program (one per dtype) and the unit direction's may compile.

    model, names = compiles.counting(pz.init_ensemble, 0, 3, tokens=11, dim=13, a_scale=0.5, a_offset=1.0)
    assert set(names) <= {"jit(_inverse_erf)"}, names
    direction, names = compiles.counting(pz.random_direction, 4, 17)
    assert set(names) <= {"jit(_inverse_erf)", "jit(_unit)"}, names
    times, names = compiles.counting(check_times, 0, 2.5, np.linspace(0.0, 2.5, 19))
    assert names == [], names
    levels = (0.31, 0.42, 0.53, 0.64, 0.75, 0.86)
    targets, names = compiles.counting(Targets.of, levels, 0.02)
    assert names == [], names
    # and the same numbers as drawn by jax.random and converted by jnp
    V, a = jax.vmap(
        lambda k: tuple(jax.random.normal(j, s) for j, s in zip(jax.random.split(k), [(13, 11), (11,)]))
    )(pz.init_keys(0, 3))
    np.testing.assert_array_equal(model.V, 0.1 * V)
    np.testing.assert_array_equal(model.a, 1.0 + 0.5 * a)
    b = jax.random.normal(jax.random.key(4), (17,))
    np.testing.assert_array_equal(direction.b, b / jnp.linalg.norm(b))
    np.testing.assert_array_equal(times[2], jnp.linspace(0.0, 2.5, 19))
    assert [t.dtype for t in times] == [jnp.float64] * 3
    np.testing.assert_array_equal(targets.values, jnp.asarray([*levels, 0.02]))
    np.testing.assert_array_equal(targets.kinds, jnp.asarray([0] * 6 + [1]))
    assert (targets.kinds.dtype, targets.values.dtype) == (jnp.int64, jnp.float64)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_objectives_drawn_on_the_host_are_jax_randoms(dtype, monkeypatch):
    # random_direction, conditioned_regression and random_labels from an int seed or a key,
    # built with the host's draws and with jax.random's (the host path switched off), in
    # float64 and, with x64 off, float32; and the direction's draw against jax.random itself
    host_max = _host_draws.HOST_MAX_HASHES
    build = lambda seed: (
        pz.random_direction(seed, 7),
        pz.conditioned_regression(seed, 9, 4, 3.0),
        pz.random_labels(seed, 9, 4),
    )
    with jax.enable_x64(dtype == "float64"):
        for seed in (0, 5, 2**31 - 1, jax.random.key(11)):
            monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", host_max)
            drawn = build(seed)
            key = jax.random.key(seed) if isinstance(seed, int) else seed
            host = _host_draws.normal(_host_draws.seed_or_key(seed), (7,))
            np.testing.assert_array_equal(host, jax.random.normal(key, (7,)))
            monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", 0)
            want = build(seed)
            assert drawn[0].b.dtype == np.dtype(dtype)
            for got, ref in zip(drawn, want, strict=True):
                for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
                    np.testing.assert_array_equal(g, w)


def test_keys_outside_the_host_path_are_drawn_by_jax(monkeypatch):
    # negative or large seeds and traced keys take jax.random's own path
    assert _host_draws.seed_or_key(-1) == -1 and _host_draws.seed_or_key(2**31) == 2**31
    traced = jax.jit(lambda k: _host_draws.normal(k, (3,)))(jax.random.key(4))
    np.testing.assert_array_equal(traced, jax.random.normal(jax.random.key(4), (3,)))
    for seed in (-3, 2**40):
        want = jax.random.normal(jax.random.key(seed), (5,))
        np.testing.assert_array_equal(pz.random_direction(seed, 5).b, want / jnp.linalg.norm(want))


def test_another_default_prng_is_never_drawn_on_the_host():
    # an int seed is Threefry key data on the host only under JAX's default Threefry:
    # with another default implementation the objectives are jax.random's draws of its keys
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        assert not _host_draws.host_seed(3)
        b = jax.random.normal(jax.random.key(3), (5,))
        np.testing.assert_array_equal(pz.random_direction(3, 5).b, pz.LogisticDirection(b).b)
        kx, kw = jax.random.split(jax.random.key(4))
        X = jax.random.normal(kx, (6, 3))
        labels = pz.random_labels(4, 6, 3)
        np.testing.assert_array_equal(labels.X, X)
        np.testing.assert_array_equal(labels.y, jnp.where(X @ jax.random.normal(kw, (3,)) >= 0, 1.0, -1.0))
    finally:
        jax.config.update("jax_default_prng_impl", "threefry2x32")


def _jax_prompt_task(key, samples, tokens, dim):
    """`prompt_task` written with jax.random alone (as it was before the host draws)."""
    kx, ky, kv = jax.random.split(as_key(key), 3)
    X = jax.random.normal(kx, (samples, tokens, dim))
    y = jnp.where(jax.random.bernoulli(ky, 0.5, (samples,)), 1.0, -1.0)
    return X, y, jax.random.normal(kv, (dim,))


@pytest.mark.parametrize("key", [0, 7, 2**31 + 5, "key"], ids=["seed 0", "seed 7", "seed 2^31+5", "jax key"])
def test_prompt_draws_are_jax_randoms_bit_for_bit(key, compiles, monkeypatch):
    # prompt_task and init_prompts hash their normals on the host where that gives the
    # same bits (a seed the host derives, a concrete Threefry key): jax.random's numbers,
    # with and without the host path, float64 and float32, from any start
    drawn_here = key != 2**31 + 5  # a seed JAX derives its own way is drawn by JAX
    key = jax.random.fold_in(jax.random.key(11), 3) if key == "key" else key
    (X, y, v), names = compiles.counting(pz.prompt_task, key, 6, 5, 7)
    for got, want in zip((X, y, v), _jax_prompt_task(key, 6, 5, 7), strict=True):
        np.testing.assert_array_equal(got, want)
    assert "jit(_normal)" not in names or not drawn_here, names  # drawn here: never compiled
    for dtype in ("float64", "float32"):
        Xd = X.astype(dtype)
        keys = pz.init_keys(key, 13, start=9)
        draw = jax.vmap(lambda k: jax.random.normal(k, (2, 7), dtype))(keys)
        got, names = compiles.counting(pz.init_prompts, key, 13, Xd, v, v_scale=0.5, start=9)
        np.testing.assert_array_equal(got.p, 0.3 * draw[:, 0])
        np.testing.assert_array_equal(got.v, 0.5 * draw[:, 1])
        assert "jit(_normal)" not in names or not drawn_here, names
        monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", 0)  # too large for the host
        big = pz.init_prompts(key, 13, Xd, v, v_scale=0.5, start=9)
        np.testing.assert_array_equal(big.p, got.p)
        np.testing.assert_array_equal(big.v, got.v)
        monkeypatch.undo()
