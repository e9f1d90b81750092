"""Sink metrics against hand-made maps and plain Python loops."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from polarize import sinks


def uniform_causal(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    for i in range(n):
        a[i, : i + 1] = 1.0 / (i + 1)
    return a


def loop_metrics(a: np.ndarray) -> dict:
    """Reference: one head, rows as Python lists, zero rows skipped."""
    bos, spars, ent, rows = 0.0, 0.0, 0.0, 0
    for row in np.abs(a):
        total = sum(row)
        if total == 0:
            continue
        rows += 1
        p = [x / total for x in row]
        bos += p[0]
        spars += max(p)
        ent -= sum(x * math.log(x) for x in p if x > 0)
    n = a.shape[0]
    alpha = []
    for k in range(n):
        vals = []
        for i in range(k, n):
            total = sum(abs(x) for x in a[i])
            vals.append(abs(a[i, k]) / total if total > 0 else 0.0)
        alpha.append(sum(vals) / len(vals))
    return dict(bos=bos / rows, sparsity=spars / rows, entropy=ent / rows, alpha=alpha)


def test_all_on_bos_is_a_perfect_sink():
    a = np.zeros((2, 5, 5))
    a[..., 0] = 1.0
    assert np.allclose(sinks.bos_share(a), 1.0)
    assert np.allclose(sinks.sparsity(a), 1.0)
    assert np.allclose(sinks.mean_entropy(a), 0.0)
    assert np.allclose(sinks.importance(a)[:, 0], 1.0)
    assert np.allclose(sinks.sink_share(a), [1, 0, 0, 0, 0])


def test_uniform_causal_map_matches_closed_form():
    n = 6
    a = uniform_causal(n)[None]
    harmonic = sum(1.0 / (i + 1) for i in range(n)) / n
    assert np.allclose(sinks.bos_share(a), harmonic)
    assert np.allclose(sinks.sparsity(a), harmonic)
    assert np.allclose(sinks.mean_entropy(a), sum(math.log(i + 1) for i in range(n)) / n)
    alpha0 = sum(1.0 / (i + 1) for i in range(n)) / n
    assert np.isclose(sinks.importance(a)[0, 0], alpha0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unnormalized_maps_match_loops(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(3, 7, 7)) * rng.uniform(0.1, 5.0, size=(3, 7, 1))  # signed, unnormalized
    a[1, 2] = 0.0  # a zero row is skipped
    for h in range(3):
        ref = loop_metrics(a[h])
        assert np.isclose(sinks.bos_share(a)[h], ref["bos"])
        assert np.isclose(sinks.sparsity(a)[h], ref["sparsity"])
        assert np.isclose(sinks.mean_entropy(a)[h], ref["entropy"])
        assert np.allclose(sinks.importance(a)[h], ref["alpha"])
    share = (sinks.importance(a) > 0.3).mean(0)
    assert np.allclose(sinks.sink_share(a), share)


def test_scaling_rows_changes_nothing():
    rng = np.random.default_rng(3)
    a = rng.uniform(size=(2, 4, 5, 5))
    b = a * rng.uniform(0.5, 20.0, size=(2, 4, 5, 1))
    for f in (sinks.bos_share, sinks.sparsity, sinks.mean_entropy, sinks.importance):
        assert np.allclose(f(a), f(b))


def test_numpy_in_numpy_out_jax_in_jax_out():
    a = np.random.default_rng(4).uniform(size=(2, 3, 4, 4))
    for f in (
        sinks.bos_share,
        sinks.sparsity,
        sinks.mean_entropy,
        sinks.importance,
        sinks.sink_share,
        sinks.row_entropy,
        sinks.renormalize,
    ):
        out_np, out_jax = f(a), f(jnp.asarray(a))
        assert isinstance(out_np, np.ndarray) and not isinstance(out_np, type(out_jax))
        assert np.allclose(out_np, np.asarray(out_jax))


def test_massive_activations_needs_both_conditions():
    h = np.full((4, 8), 0.01)
    h[1, 3] = 150.0  # > 100 and > 1000 x median: massive
    h[2, 5] = -200.0  # sign does not matter
    h[3, 1] = 5.0  # > 1000 x median but not > 100
    assert sorted(zip(*np.nonzero(sinks.massive_activations(h)))) == [(1, 3), (2, 5)]
    assert not sinks.massive_activations(np.full((3, 3), 150.0)).any()  # big but typical


def test_head_table_layouts_and_text():
    a = np.zeros((2, 3, 4, 4))
    a[0, :, :, 0] = 1.0
    a[1] = uniform_causal(4)
    t = sinks.head_table(a)
    assert t["bos_share"].shape == (2, 3)
    assert np.allclose(t["sink_share"], [1.0, 1.0])  # alpha_0 of uniform causal = 0.52 > 0.3
    assert np.allclose(sinks.head_table(a[0])["bos_share"], t["bos_share"][:1])
    assert np.allclose(sinks.head_table(np.stack([a, a]))["sparsity"], t["sparsity"])
    text = sinks.format_table(t)
    assert "Sink_0^0.3 = 1.000" in text and len(text.splitlines()) == 1 + 2 * 4
    with pytest.raises(ValueError, match="attention must be"):
        sinks.head_table(np.zeros((4, 4)))
