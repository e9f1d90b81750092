"""The same initializations under the exact flow, GD at many step sizes, momentum, Adam and modified flow.

Softmax, logistic loss along b, T = d = 8, V(0) = 0.1 N(0, 1), a(0) = 0, horizon t = 100
(time = steps x lr; for heavy-ball momentum beta = 0.9 the effective step lr / (1 - beta)).
Shows: GD's error against the flow is first order in lr (fitted slope about 1); where
discrete steps polarize faster or slower than the flow per unit time; and that the
modified flow of backward error analysis, dtheta/dt = -grad(L + (lr/4) |grad L|^2)
(`pz.modified_flow`), tracks GD to second order, far better than the plain flow.

    python examples/flow_vs_gd.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import optax  # noqa: E402
from _common import finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

TOKENS = DIM = 8
HORIZON = 100.0
FIT_MAX_LR = 0.1  # fit the error slopes in the asymptotic regime lr <= 0.1


def final_gap(traj_a, traj_b) -> np.ndarray:
    """max_j |s_j - s'_j| at the last saved time, per initialization."""
    return np.max(np.abs(np.asarray(traj_a.weights[:, -1]) - np.asarray(traj_b.weights[:, -1])), axis=-1)


def fit(lrs, err) -> float:
    keep = (lrs <= FIT_MAX_LR) & (err > 0)
    return float(np.polyfit(np.log(lrs[keep]), np.log(err[keep]), 1)[0])


def main(argv=None) -> dict:
    args = parse("flow_vs_gd", __doc__.splitlines()[0], argv)
    n_inits = 16 if args.small else 256
    lrs = (
        np.array([0.1, 0.05])
        if args.small
        else np.array([1e-3, 2.5e-3, 1e-2, 2.5e-2, 0.1, 0.25, 1.0, 2.5, 10.0, 25.0])
    )
    objective = pz.random_direction(args.seed + 1, DIM)
    model = pz.init_ensemble(args.seed, n_inits, tokens=TOKENS, dim=DIM)
    flow = pz.flow(model, objective, t1=HORIZON, ts=[0.0, HORIZON], rtol=1e-11, atol=1e-13)
    mw = lambda traj: np.max(np.asarray(traj.weights[:, -1]), axis=-1)
    mw_flow = mw(flow)

    rows, gd_err, mod_err, gd_mw, gd_faster, mom_mw, adam_mw, n_failed = [], [], [], [], [], [], [], []
    for lr in lrs:
        steps = max(1, int(round(HORIZON / lr)))
        gd = pz.descend(model, objective, float(lr), steps=steps, save_at=[0, steps])
        t_gd = float(gd.ts[-1])  # steps x lr: both flows are compared with GD at exactly that time
        ref = pz.flow(model, objective, t1=t_gd, ts=[0.0, t_gd], rtol=1e-11, atol=1e-13)
        mod = pz.modified_flow(model, objective, float(lr), t1=t_gd, ts=[0.0, t_gd], rtol=1e-11, atol=1e-13)
        ok = np.asarray(gd.ok) & np.asarray(mod.ok) & np.asarray(ref.ok)
        n_failed.append(int((~ok).sum()))
        gd_err.append(float(np.median(final_gap(gd, ref)[ok])) if ok.any() else np.nan)
        mod_err.append(float(np.median(final_gap(gd, mod)[ok])) if ok.any() else np.nan)
        gd_mw.append(float(np.median(mw(gd)[ok])) if ok.any() else np.nan)
        gd_faster.append(float(np.mean(mw(gd)[ok] > mw_flow[ok])) if ok.any() else np.nan)
        # heavy ball at the same effective step lr = lr_m / (1 - 0.9), and Adam at step size lr (nominal time)
        mom = pz.descend(
            model, objective, optax.sgd(0.1 * lr, momentum=0.9), steps=steps, lr=float(lr), save_at=[0, steps]
        )
        mom_mw.append(float(np.median(mw(mom)[np.asarray(mom.ok)])) if np.any(mom.ok) else np.nan)
        adam = pz.descend(model, objective, optax.adam(lr), steps=steps, lr=float(lr), save_at=[0, steps])
        adam_mw.append(float(np.median(mw(adam)[np.asarray(adam.ok)])) if np.any(adam.ok) else np.nan)
        rows.append(
            [
                float(lr),
                steps,
                n_failed[-1],
                gd_err[-1],
                mod_err[-1],
                gd_mw[-1],
                gd_faster[-1],
                mom_mw[-1],
                adam_mw[-1],
            ]
        )
    gd_err, mod_err = np.array(gd_err), np.array(mod_err)
    slope_gd, slope_mod = fit(lrs, gd_err), fit(lrs, mod_err)

    print(f"{n_inits} inits, horizon t = {HORIZON:g}; flow median max weight at t: {np.median(mw_flow):.4f}")
    table(
        [
            "lr",
            "steps",
            "failed",
            "|GD-flow|",
            "|GD-modified|",
            "GD max w",
            "share GD > flow",
            "momentum max w",
            "Adam max w",
        ],
        rows,
    )
    print(
        f"fitted slope (lr <= {FIT_MAX_LR}) of median |GD - flow|: {slope_gd:.3f}; "
        f"of |GD - modified flow|: {slope_mod:.3f}"
    )

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), constrained_layout=True)
    axes[0].loglog(lrs, gd_err, "o-", label=f"GD vs flow (slope {slope_gd:.2f})")
    axes[0].loglog(lrs, mod_err, "s-", label=f"GD vs modified flow (slope {slope_mod:.2f})")
    axes[0].set(
        xlabel="lr", ylabel=f"median max_j |s_j difference| at t = {HORIZON:g}", title="discretization error"
    )
    axes[1].semilogx(lrs, gd_mw, "o-", label="GD")
    axes[1].semilogx(lrs, mom_mw, "^-", label="heavy ball 0.9 (effective lr)")
    axes[1].semilogx(lrs, adam_mw, "v-", label="Adam (time = steps x lr)")
    axes[1].axhline(np.median(mw_flow), color="k", ls="--", label="exact flow")
    axes[1].set(
        xlabel="lr", ylabel=f"median max weight at t = {HORIZON:g}", title="polarization per unit time"
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, args, "flow_vs_gd.png")
    return finish(
        args,
        {
            "n_inits": n_inits,
            "horizon": HORIZON,
            "slope_gd_vs_flow": slope_gd,
            "slope_gd_vs_modified": slope_mod,
            "flow_median_max_weight": float(np.median(mw_flow)),
            "by_lr": {
                f"{lr:g}": dict(
                    zip(
                        [
                            "steps",
                            "failed",
                            "gd_vs_flow",
                            "gd_vs_modified",
                            "gd_max_weight",
                            "share_gd_more_polarized",
                            "momentum_max_weight",
                            "adam_max_weight",
                        ],
                        row[1:],
                        strict=True,
                    )
                )
                for lr, row in zip(lrs, rows, strict=True)
            },
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
