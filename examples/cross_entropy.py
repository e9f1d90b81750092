"""The paper's KL / cross-entropy objective: L = -sum_k p_k log softmax(V sigma(a))_k.

10 classes, V 10 x 10 (V(0) = 0.1 N(0, 1)), a(0) = 0, p = softmax(10 U[0, 1])
(`pz.peaked_distribution`), exact flow to t = 1e7 as in the paper (1e7 GD steps). Once the
excess loss is tiny the flow is stiff; the default stiff solver (`polarize.solve._stiff`) steps
over it in a few hundred steps per initialization, default options throughout.
The loss has a finite minimum, H(p), reached at beta = log p + c. The question asked
here: does polarization continue after the loss has converged, or stop with it? Reported:
max weight and entropy bands, the excess loss, V's top singular share, how the winning
value column aligns with log p, and the change in max weight after convergence.

    python examples/cross_entropy.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

CLASSES = 10


def cosine(x, y) -> np.ndarray:
    return np.sum(x * y, axis=-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))


def main(argv=None) -> dict:
    args = parse("cross_entropy", __doc__.splitlines()[0], argv)
    n_inits, t1 = (32, 1e5) if args.small else (1000, 1e7)
    objective = pz.peaked_distribution(args.seed + 1, CLASSES)
    p = np.asarray(objective.p)
    log_p = np.log(p) - np.mean(np.log(p))  # the direction of every minimizer, centered
    model = pz.init_ensemble(args.seed, n_inits, tokens=CLASSES, dim=CLASSES)
    ts = np.minimum(pz.save_times(t1, 41), t1)
    traj = pz.flow(model, objective, ts=ts, t1=t1)  # default: the stiff solver
    s = pz.summarize(traj, objective)
    ok = s.final["ok"]
    V = np.asarray(traj.V)[ok]
    weights = np.asarray(traj.weights)[ok]
    winner = s.final["winner"][ok]
    v_win = V[np.arange(len(winner)), -1, :, winner]  # winning token's value column at the end
    beta = np.einsum("ndk,nk->nd", V[:, -1], weights[:, -1])
    centered = lambda x: x - x.mean(axis=-1, keepdims=True)
    cos_win, cos_beta = cosine(centered(v_win), log_p), cosine(centered(beta), log_p)
    excess = s.series["loss"][ok] + np.sum(p * np.log(p))  # L - H(p) >= 0

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    keep = ts > 0
    band(axes[0], ts[keep], s.series["max_weight"][ok][:, keep], label="max weight")
    band(axes[0], ts[keep], s.series["top_share"][ok][:, keep], label="V top singular share")
    axes[0].axhline(1 / CLASSES, color="gray", ls=":", label="uniform")
    axes[0].set(xscale="log", xlabel="t", ylabel="median, 10-90%", title="polarization and rank of V")
    band(axes[1], ts[keep], np.maximum(excess[:, keep], 1e-16), label="L - H(p)")
    axes[1].set(xscale="log", yscale="log", xlabel="t", ylabel="excess loss", title="excess cross-entropy")
    axes[2].hist(s.final["max_weight"][ok], bins=30, alpha=0.6, label="final max weight")
    axes[2].hist(cos_win, bins=30, alpha=0.6, label="cos(v_winner, log p), centered")
    axes[2].set(xlabel="value", ylabel="initializations", title=f"t = {t1:.0e}, {int(ok.sum())} inits")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, args, "cross_entropy.png")

    rows = []
    for t in [x for x in (1e0, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7) if x <= t1]:
        k = int(np.argmin(np.abs(np.log1p(ts) - np.log1p(t))))
        rows.append(
            [
                f"{ts[k]:.3g}",
                float(np.median(s.series["max_weight"][ok, k])),
                float(np.mean(s.series["max_weight"][ok, k] >= 0.9)),
                float(np.median(s.series["entropy"][ok, k])),
                float(np.median(s.series["top_share"][ok, k])),
                float(np.median(excess[:, k])),
            ]
        )
    table(["t", "median max w", "share >= 0.9", "median H", "median top share", "median L - H(p)"], rows)
    print(
        f"median cos(centered winning column, centered log p) = {np.median(cos_win):.4f}; "
        f"of beta: {np.median(cos_beta):.4f}; failed: {int((~ok).sum())}"
    )
    # After convergence: from the first saved time with excess loss below 1e-8 to t1.
    mw = s.series["max_weight"][ok]
    converged = excess <= 1e-8
    reached = converged.any(axis=1)
    k_conv = np.argmax(converged, axis=1)
    after = mw[:, -1] - mw[np.arange(len(mw)), k_conv]
    after, t_conv = after[reached], ts[k_conv[reached]]
    k5 = int(np.argmin(np.abs(np.log1p(ts) - np.log1p(min(1e5, t1)))))
    late = np.abs(mw[:, -1] - mw[:, k5])
    print(
        f"after the excess loss falls below 1e-8 (median t = {np.median(t_conv):.3g}, "
        f"{int(reached.sum())}/{len(mw)} inits): max weight changes by median {np.median(after):.2e} "
        f"(90% of |change| below {np.percentile(np.abs(after), 90):.2e}); "
        f"from t = {ts[k5]:.3g} to {t1:.0e}: median |change| {np.median(late):.2e}, max {late.max():.2e}"
    )
    return finish(
        args,
        {
            "n_inits": n_inits,
            "t1": t1,
            "n_failed": int((~ok).sum()),
            "median_max_weight": float(np.median(s.final["max_weight"][ok])),
            "one_hot_fraction": float(np.mean(s.final["max_weight"][ok] >= 0.9)),
            "median_top_share": float(np.median(s.final["top_share"][ok])),
            "median_cos_winner_logp": float(np.median(cos_win)),
            "median_cos_beta_logp": float(np.median(cos_beta)),
            "median_excess_loss": float(np.median(excess[:, -1])),
            "median_t_converged": float(np.median(t_conv)) if len(t_conv) else float("inf"),
            "median_max_weight_change_after_convergence": float(np.median(after)) if len(after) else 0.0,
            "p90_abs_max_weight_change_after_convergence": (
                float(np.percentile(np.abs(after), 90)) if len(after) else 0.0
            ),
            "median_abs_max_weight_change_1e5_to_t1": float(np.median(late)),
            "median_solver_steps": float(np.median(np.asarray(traj.steps)[ok])),
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
