"""Statistics against independent references (numpy's SVD)."""

import jax.numpy as jnp
import numpy as np

from polarize.statistics import top_singular_share


def test_top_singular_share_matches_numpy_svd():
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((8, 8)) for _ in range(20)]
    cases += [
        rng.standard_normal((5, 3)),
        rng.standard_normal((3, 5)),
        np.eye(4),  # four equal singular values
        np.diag([1.0, 1.0 - 1e-9, 0.5]),  # a top pair closer than any squaring separates
        np.outer(rng.standard_normal(6), rng.standard_normal(6)) + 1e-9 * rng.standard_normal((6, 6)),
        1e-150 * rng.standard_normal((4, 4)),
        1e150 * rng.standard_normal((4, 4)),
    ]
    got = np.array([float(top_singular_share(jnp.asarray(V))) for V in cases])
    ref = []
    for V in cases:
        s = np.linalg.svd(V / np.abs(V).max(), compute_uv=False)
        ref.append(s[0] ** 2 / np.sum(s**2))
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    assert got[-4] < 1.0 and abs(got[-3] - 1.0) < 1e-12  # not rank one, then nearly rank one
    batch = jnp.stack([jnp.asarray(c) for c in cases[:20]])
    np.testing.assert_allclose(top_singular_share(batch), got[:20], rtol=1e-14)
    assert float(top_singular_share(jnp.zeros((3, 3)))) == 1.0
    assert np.isnan(float(top_singular_share(jnp.full((3, 3), jnp.nan))))
