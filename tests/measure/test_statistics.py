"""Statistics against independent references (numpy's SVD)."""

import jax.numpy as jnp
import numpy as np

import polarize as pz
from polarize.measure._statistics import top_singular_share


def _embed(M, n=8):
    """M in the top-left corner of an n x n zero matrix (same nonzero singular values)."""
    out = np.zeros((n, n))
    out[: M.shape[0], : M.shape[1]] = M
    return out


def test_top_singular_share_matches_numpy_svd():
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((8, 8)) for _ in range(12)]
    cases += [
        _embed(np.eye(4)),  # four equal singular values
        _embed(np.diag([1.0, 1.0 - 1e-9, 0.5])),  # a top pair closer than any squaring separates
        _embed(np.outer(rng.standard_normal(6), rng.standard_normal(6)) + 1e-9 * rng.standard_normal((6, 6))),
        1e-150 * rng.standard_normal((8, 8)),
        1e150 * rng.standard_normal((8, 8)),
    ]
    got = np.asarray(top_singular_share(jnp.asarray(np.stack(cases))))  # one batched call
    ref = []
    for V in cases:
        s = np.linalg.svd(V / np.abs(V).max(), compute_uv=False)
        ref.append(s[0] ** 2 / np.sum(s**2))
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    assert got[12] == 0.25 or abs(got[12] - 0.25) < 1e-15  # the identity block: 1/4
    assert abs(got[14] - 1.0) < 1e-12  # nearly rank one
    for V in (rng.standard_normal((5, 3)), rng.standard_normal((3, 5))):  # either Gram side
        s = np.linalg.svd(V, compute_uv=False)
        np.testing.assert_allclose(
            float(top_singular_share(jnp.asarray(V))), s[0] ** 2 / np.sum(s**2), rtol=1e-13
        )
    assert float(top_singular_share(jnp.zeros((3, 5)))) == 1.0
    assert np.isnan(float(top_singular_share(jnp.full((3, 5), jnp.nan))))
    # each matrix stops squaring on its own: its share is the same alone as beside one
    # that needs every squaring (a top pair 1e-6 apart), to the last bit
    slow = _embed(np.diag([1.0, 1.0 - 1e-6, 0.3]))
    for V in cases[:3] + cases[14:15]:
        alone = top_singular_share(jnp.asarray(np.stack([V, V])))[0]
        beside = top_singular_share(jnp.asarray(np.stack([V, slow])))[0]
        assert alone == beside
    s = np.linalg.svd(slow, compute_uv=False)
    share = float(top_singular_share(jnp.asarray(slow)))
    np.testing.assert_allclose(share, s[0] ** 2 / np.sum(s**2), rtol=1e-13)


def test_top_singular_share_is_reverse_differentiable():
    """jax.grad through the squarings against central differences of the SVD share."""
    import jax

    V = np.random.default_rng(3).standard_normal((6, 4))
    grad = np.asarray(jax.grad(top_singular_share)(jnp.asarray(V)))

    def share(V):
        s = np.linalg.svd(V, compute_uv=False)
        return s[0] ** 2 / np.sum(s**2)

    h, numeric = 1e-6, np.zeros_like(V)
    for index in np.ndindex(V.shape):
        step = np.zeros_like(V)
        step[index] = h
        numeric[index] = (share(V + step) - share(V - step)) / (2 * h)
    np.testing.assert_allclose(grad, numeric, atol=1e-8)
    assert np.abs(numeric).max() > 1e-3  # not a flat point


def test_quantile_matches_numpy_and_is_infinite_next_to_an_inf():
    from polarize.measure._statistics import quantile

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 1000, 1001):
        x = rng.standard_normal(n)
        for q in (0.0, 0.1, 0.5, 0.9, 1.0):
            np.testing.assert_allclose(quantile(x, q), np.quantile(x, q), rtol=1e-15, atol=1e-300)
    # levels most initializations never reached: the median is inf (numpy says nan)
    x = np.array([3.0, np.inf, 1.0, np.inf, np.inf])
    assert quantile(x, 0.5) == np.inf and quantile(x, 0.1) == 1.0 + 0.4 * 2.0
    assert quantile(np.array([2.0, np.inf]), 0.5) == np.inf and quantile([], 0.5) is None


def test_a_failed_initializations_statistics_are_nan_not_polarized():
    # stopped at max_steps, its last states are NaN; entropy(NaN weights) would read 0 (one-hot)
    import jax

    jax.config.update("jax_enable_x64", True)
    import polarize as pz

    obj = pz.random_direction(1, 4)
    traj = pz.flow(pz.init_ensemble(0, 3, tokens=4, dim=4), obj, t1=1e3, max_steps=5)
    good = pz.flow(pz.init_ensemble(0, 3, tokens=4, dim=4), obj, t1=1e3)
    assert not np.any(traj.ok) and np.all(good.ok)
    summary = pz.summarize(traj, obj)
    for name in ("max_weight", "entropy", "eff_tokens", "loss"):
        assert np.all(np.isnan(summary.final[name])), name
        assert np.all(np.isnan(summary.series[name])), name
    np.testing.assert_array_equal(summary.final["winner"], -1)
    assert not np.any(summary.final["order_preserved"])
    assert summary.aggregates["n_failed"] == summary.aggregates["failed_max_steps_reached"] == 3
    # an ensemble that succeeded keeps its numbers
    assert np.all(np.isfinite(pz.summarize(good, obj).final["entropy"]))


def test_a_first_summary_compiles_two_programs_and_its_flags_are_a_loop_over_pairs(compiles):
    """`summarize`'s series and its order statistics are one program each in fixed blocks,
    not one small program per operation (about 30 on a first call before). Shapes no other
    test uses, so that nothing is compiled already; a(0) against u(0)'s order, so that
    some initializations cross."""
    obj = pz.random_direction(3, 5)
    model = pz.init_ensemble(6, 9, tokens=3, dim=5, a_scale=0.5)
    traj = pz.flow(model, obj, t1=1e4, n_save=24)
    summary, compiled = compiles.counting(pz.summarize, traj, obj)
    assert sorted(compiled) == ["jit(_order_by_block)", "jit(_series_by_block)"], compiled
    u = np.einsum("itdk,d->itk", np.asarray(traj.V), np.asarray(obj.b))
    a = np.asarray(traj.a)
    crosses = lambda x: any(  # any two columns of x (times, tokens) swap order at some time
        np.any((x[:, j] - x[:, k]) * (x[-1, j] - x[-1, k]) < 0) for j in range(3) for k in range(j)
    )
    loop = [not (crosses(u[i]) or crosses(a[i])) for i in range(9)]
    np.testing.assert_array_equal(summary.final["order_preserved"], loop)
    assert 0 < sum(loop) < 9, loop
    winner = np.argmax(np.abs(np.asarray(traj.weights[:, -1])), axis=-1) == np.argmax(u[:, 0], axis=-1)
    np.testing.assert_array_equal(summary.final["winner_is_argmax_u0"], winner)


def test_final_entropy_is_one_program_and_numpys_entropy(compiles):
    """A first `final_entropy` compiles one program (14 small ones op by op before), and
    it is -sum p log p of p = |s| / sum |s| at the last saved time, by numpy."""
    obj = pz.random_direction(3, 5)
    traj = pz.flow(pz.init_ensemble(6, 11, tokens=3, dim=5, norm="sigmoid"), obj, t1=50.0, n_save=5)
    H, compiled = compiles.counting(pz.final_entropy, traj)
    assert compiled == ["jit(_entropy_at_last)"], compiled
    s = np.abs(np.asarray(traj.weights)[:, -1])
    p = s / s.sum(-1, keepdims=True)
    np.testing.assert_allclose(H, -np.sum(p * np.log(p), -1), rtol=1e-13)
