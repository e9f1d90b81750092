"""Sink metrics against hand-made maps and plain Python loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from polarize.measure import sinks


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
    return dict(bos=bos / rows, sparsity=spars / rows, entropy=ent / rows, alpha=loop_alpha(a))


def loop_alpha(a: np.ndarray, bidirectional: bool = False) -> list:
    """Gu et al.'s alpha_k: mean over queries that see key k (i >= k, or all), zero rows skipped."""
    n = a.shape[0]
    alpha = []
    for k in range(n):
        vals = []
        for i in range(0 if bidirectional else k, n):
            total = sum(abs(x) for x in a[i])
            if total > 0:
                vals.append(abs(a[i, k]) / total)
        alpha.append(sum(vals) / len(vals) if vals else 0.0)
    return alpha


def loop_bos_score(a: np.ndarray) -> float:
    """The paper's rel_attn_bos_global of one head on one sequence: rows 1..L-3, signed sums."""
    rows = range(1, a.shape[0] - 2)
    bos = sum(a[i, 0] for i in rows)
    total = sum(a[i, j] for i in rows for j in range(a.shape[1]))
    return bos / total if total != 0 else 0.0


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
        # a full map is bidirectional: alpha_k averages over all (non-zero) rows
        assert np.allclose(sinks.importance(a)[h], loop_alpha(a[h], bidirectional=True))
        assert np.allclose(sinks.importance(np.tril(a))[h], loop_metrics(np.tril(a[h]))["alpha"])
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
        sinks.bos_score,
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


def test_bidirectional_maps_average_over_all_queries():
    rng = np.random.default_rng(5)
    a = rng.uniform(size=(3, 6, 6))
    a[2, 4] = 0.0  # a zero row is skipped here too
    assert sinks.convention(a) == "bidirectional"
    causal = np.tril(a)
    assert sinks.convention(causal) == "causal"
    for h in range(3):
        assert np.allclose(sinks.importance(a)[h], loop_alpha(a[h], bidirectional=True), rtol=1e-12)
        assert np.allclose(sinks.importance(causal)[h], loop_alpha(causal[h]), rtol=1e-12)
    # one weight above the diagonal anywhere switches the whole array to all queries
    b = causal.copy()
    b[0, 1, 3] = 1e-3
    assert sinks.convention(b) == "bidirectional"
    assert np.allclose(sinks.importance(b)[1], loop_alpha(b[1], bidirectional=True))
    # the same under jit
    jitted = jax.jit(sinks.importance)
    for m in (a, causal, b):
        assert np.allclose(np.asarray(jitted(jnp.asarray(m))), sinks.importance(m), rtol=1e-12)


def test_sink_share_at_k_and_near_eps():
    a = np.zeros((4, 5, 5))
    a[..., 0] = 1.0  # rows are made below; start from a causal all-on-key-0 map
    # head 0: alpha_2 exactly 0.3 (rows i >= 2 put 0.3 on key 2): not a sink (strict >)
    # head 1: alpha_2 = 0.3 + 1e-6: a sink; head 2: 0.3 - 1e-6: not; head 3: 0.9: a sink
    for h, w in enumerate([0.3, 0.3 + 1e-6, 0.3 - 1e-6, 0.9]):
        for i in range(2, 5):
            a[h, i] = 0.0
            a[h, i, 2] = w
            a[h, i, 0] = 1 - w
    alpha2 = sinks.importance(a)[:, 2]
    assert np.allclose(alpha2, [0.3, 0.3 + 1e-6, 0.3 - 1e-6, 0.9], atol=1e-12)
    assert np.allclose(sinks.sink_share(a)[2], 0.5) and np.allclose(sinks.sink_share(a)[0], 1.0)
    t = sinks.head_table(a, key=2)
    assert list(t["sink"][0]) == [False, True, False, True] and t["sink_share_all"] == 0.5


def test_bos_score_is_the_papers_slice():
    rng = np.random.default_rng(6)
    a = rng.normal(size=(5, 2, 8, 8))  # signed, like raw dot-product attention
    a[1, 0, 1:6] = 0.0  # every counted row has zero mass: scores 0
    a[2, 1, 3] = 0.0  # one zero row: adds nothing
    got = sinks.bos_score(a)
    assert got.shape == (5, 2)
    for n in range(5):
        for h in range(2):
            assert np.isclose(got[n, h], loop_bos_score(a[n, h]), rtol=1e-12)
    assert got[1, 0] == 0.0
    assert np.allclose(np.asarray(jax.jit(sinks.bos_score)(jnp.asarray(a))), got)


def test_head_table_overall_sink_share():
    """Gu et al.'s overall number: 5 sink heads of 3 layers x 4 heads = 41.7%."""
    a = np.zeros((3, 4, 6, 6))
    for layer in range(3):
        for h in range(4):
            a[layer, h] = np.eye(6)  # alpha_0 = 1/6: no sink
    for layer, h in [(0, 0), (0, 3), (1, 1), (2, 0), (2, 2)]:
        a[layer, h] = 0.0
        a[layer, h, :, 0] = 1.0
    t = sinks.head_table(a)
    assert t["sink"].sum() == 5 and np.isclose(t["sink_share_all"], 5 / 12)
    assert np.allclose(t["sink_share"], [0.5, 0.25, 0.5])
    text = sinks.format_table(t)
    assert "Sink_0^0.3 = 41.7% (5 of 12 heads)" in text and "convention: causal" in text


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
    assert "layer 1: Sink_0^0.3 = 100.0%" in text and len(text.splitlines()) == 1 + 2 * 3 + 2 + 2
    with pytest.raises(ValueError, match="attention must be"):
        sinks.head_table(np.zeros((4, 4)))


def signed_causal(rng, heads: int, n: int) -> np.ndarray:
    a = rng.normal(size=(heads, n, n))
    return a * np.tril(np.ones((n, n)))


def test_positive_mass_renormalizes_the_positive_part():
    rng = np.random.default_rng(3)
    a = signed_causal(rng, 2, 6)
    pos = np.maximum(a, 0)
    for h in range(2):
        ref = loop_metrics(pos[h])
        assert np.isclose(sinks.bos_share(a, "positive")[h], ref["bos"])
        assert np.isclose(sinks.sparsity(a, "positive")[h], ref["sparsity"])
        assert np.isclose(sinks.mean_entropy(a, "positive")[h], ref["entropy"])
        assert np.allclose(sinks.importance(a, "positive")[h], ref["alpha"])
    # under "abs" the negative weights count, so the numbers differ
    assert not np.allclose(sinks.bos_share(a, "abs"), sinks.bos_share(a, "positive"))


def test_raw_mass_keeps_the_rows_as_given():
    # softmax1: rows sum to less than one (the null mass); raw keeps that deficit
    rng = np.random.default_rng(4)
    n = 5
    logits = np.where(np.tril(np.ones((n, n))) > 0, rng.normal(size=(3, n, n)), -np.inf)
    a = np.exp(logits) / (1 + np.exp(logits).sum(-1, keepdims=True))
    alpha = [[a[h, k:, k].mean() for k in range(n)] for h in range(3)]
    assert np.allclose(sinks.importance(a, "raw"), alpha)
    assert np.allclose(sinks.bos_share(a, "raw"), a[..., 0].mean(-1))
    assert np.allclose(sinks.sparsity(a, "raw"), a.max(-1).mean(-1))
    ent = -np.where(a > 0, a * np.log(np.where(a > 0, a, 1)), 0).sum(-1).mean(-1)
    assert np.allclose(sinks.mean_entropy(a, "raw"), ent)
    # "abs" renormalizes each row to one: larger alpha than raw
    assert np.all(sinks.importance(a, "abs")[:, 0] > sinks.importance(a, "raw")[:, 0])


def test_an_unknown_mass_is_refused():
    with pytest.raises(ValueError, match="`mass` must be one of abs, positive, raw"):
        sinks.bos_share(np.ones((1, 2, 2)), "signed")


def nan_example() -> np.ndarray:
    rng = np.random.default_rng(5)
    a = np.abs(signed_causal(rng, 3, 8))[None]  # [layers=1, heads=3, 8, 8]
    return a / a.sum(-1, keepdims=True)


def test_nan_weights_are_reported_not_dropped():
    # before: the NaN row was dropped and head 1 scored on the other rows (bos 0.457 -> 0.480 in issue 30)
    a = nan_example()
    clean = sinks.head_table(a)
    a[0, 1, 3, 2] = np.nan
    table = sinks.head_table(a)
    assert table["nonfinite"] == 1 and not table["finite"][0, 1]
    assert np.isnan(table["bos_share"][0, 1]) and np.isnan(table["alpha"][0, 1])
    for name in ("bos_share", "alpha", "entropy"):  # the finite heads keep their numbers
        assert np.allclose(table[name][0, [0, 2]], clean[name][0, [0, 2]])
    assert table["sink_share_all"] == clean["sink"][0, [0, 2]].mean()
    text = sinks.format_table(table)
    assert "nonfinite" in text.splitlines()[2] and "1 nonfinite" in text


def test_an_all_nan_or_inf_layer_is_not_a_layer_of_non_sinks():
    a = np.concatenate([nan_example(), np.full((1, 3, 8, 8), np.nan)])
    a[1, 0, 0, 0] = np.inf
    table = sinks.head_table(a)
    assert table["nonfinite"] == 3 and np.isnan(table["sink_share"][1])
    assert not table["sink"][1].any() and table["sink_share_all"] == table["sink"][0].mean()
    text = sinks.format_table(table)
    assert "layer 1: Sink_0^0.3 = n/a (3 of 3 heads nonfinite, left out)" in text
    assert "0.000" not in "\n".join(line for line in text.splitlines() if line.startswith("    1 "))
    assert sinks.head_table(np.full((2, 4, 4), np.nan))["sink_share_all"] != 0
