"""Massive activations in the tied model beta = U sigma(U a): the winning value column outgrows the rest.

U(0) = I (D x D), a(0) = 1 + 0.1 N(0, 1), logistic loss along a random unit b, exact flow
to t = 1e4 (the paper's 1e4 GD steps at lr 0.05 are t = 500), D in {10, 20, 50, 100}.
Measured per initialization: |U e_win| / median_j |U e_j|, the norm of the column at the
winning token (argmax of the final weights) over the median column norm, for softmax and
for elementwise sigmoid.

    python examples/massive_activations.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

T_PAPER = 500.0


def tied_ensemble(seed: int, n: int, D: int, norm: str) -> pz.TiedValueAttention:
    """n initializations U = I, a = 1 + 0.1 N(0, 1); init i from fold_in(key(seed), i)."""
    a = jax.vmap(lambda k: 1.0 + 0.1 * jax.random.normal(k, (D,)))(pz.init_keys(seed, n))
    return pz.TiedValueAttention(jnp.broadcast_to(jnp.eye(D), (n, D, D)), a, norm)


def column_ratio(traj) -> np.ndarray:
    """|U e_win| / median_j |U e_j| at every saved time (inits, times); win = argmax final weight."""
    norms = np.linalg.norm(np.asarray(traj.V), axis=-2)  # (inits, times, D) column norms
    win = np.argmax(np.asarray(traj.weights)[:, -1], axis=-1)
    return norms[np.arange(len(win)), :, win] / np.median(norms, axis=-1)


def main(argv=None) -> dict:
    args = parse("massive_activations", __doc__.splitlines()[0], argv)
    n_inits, dims, t1 = (8, (10,), T_PAPER) if args.small else (128, (10, 20, 50, 100), 1e4)
    ts = np.unique(np.concatenate([np.minimum(pz.save_times(t1, 25), t1), [T_PAPER]]))
    k_paper = int(np.nonzero(ts == T_PAPER)[0][0])
    results, rows, numbers = {}, [], {}
    for norm in ("softmax", "sigmoid"):
        for D in dims:
            objective = pz.random_direction(args.seed + 1, D)
            traj = pz.flow(tied_ensemble(args.seed, n_inits, D, norm), objective, ts=ts, t1=t1)
            ok = np.asarray(traj.ok)
            ratio = column_ratio(traj)[ok]
            w = np.abs(np.asarray(traj.weights)[ok])
            mw = np.max(w, axis=-1) / np.sum(w, axis=-1)  # of p = |s| / sum |s|, as in pz.summarize
            results[norm, D] = ratio
            rows.append(
                [
                    norm,
                    D,
                    int((~ok).sum()),
                    float(np.median(ratio[:, k_paper])),
                    float(np.median(ratio[:, -1])),
                    float(np.percentile(ratio[:, -1], 10)),
                    float(np.percentile(ratio[:, -1], 90)),
                    float(np.median(mw[:, -1])),
                ]
            )
            numbers[f"{norm}/D={D}"] = {
                "median_ratio_t500": float(np.median(ratio[:, k_paper])),
                "median_ratio_final": float(np.median(ratio[:, -1])),
                "median_max_weight_final": float(np.median(mw[:, -1])),
                "n_failed": int((~ok).sum()),
            }
    print(f"{n_inits} inits per (norm, D); exact flow to t = {t1:g}; paper (softmax, one run): about 6x")
    table(["norm", "D", "failed", "ratio t=500", "ratio final", "10%", "90%", "max weight final"], rows)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), constrained_layout=True, sharey=True)
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(dims)))
    keep = ts > 0
    for ax, norm in zip(axes, ("softmax", "sigmoid"), strict=True):
        for D, c in zip(dims, colors, strict=True):
            band(ax, ts[keep], results[norm, D][:, keep], label=f"D = {D}", color=c)
        ax.axhline(1.0, color="gray", ls=":")
        ax.axvline(T_PAPER, color="k", ls=":", label="t = 500 (paper)")
        ax.set(
            xscale="log", yscale="log", xlabel="t", title=f"{norm}: winning column norm / median column norm"
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("|U e_win| / median_j |U e_j|  (median, 10-90%)")
    save(fig, args, "massive_activations.png")
    return finish(args, {"n_inits": n_inits, "t1": t1, "results": numbers})


if __name__ == "__main__":
    main(sys.argv[1:])
