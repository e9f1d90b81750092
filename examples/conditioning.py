"""Polarization against conditioning: square loss |y - X V sigma(a)|^2 with cond(X) = kappa.

n = d = T = 20, X = U diag(linspace(1, 1/kappa)) W^T (`pz.conditioned_regression`),
y ~ N(0, I), V(0) = 1e-5 N(0, 1), a(0) = 1e-3 N(0, 1); exact flow (the paper's GD, lr 1e-3
for 3e5 steps, is t = 300) to t = 300 and on to t = 1e5. After the loss has converged the flow
is stiff; the default stiff solver (`polarize.solve._stiff`) steps over it in a few hundred steps.
Initialization i is paired with its own dataset i (a batched objective). Reported against
kappa: final max weight, entropy, the times max weight crosses 0.5 and 0.9, how the time
the loss takes to converge relates to the polarization reached, and whether polarization
continues after the loss has converged (max weight when the loss first falls below 1e-8
of its start, against max weight at t = 1e5).

    python examples/conditioning.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, crossing_time, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

SIZE = 20  # n = d = T
T_PAPER, T_LONG = 300.0, 1e5


def datasets(seed: int, n: int, kappa: float) -> pz.Square:
    """n datasets, dataset i from fold_in(key(seed), i): a batched objective."""
    keys = pz.init_keys(seed, n)
    return jax.vmap(lambda k: pz.conditioned_regression(k, SIZE, SIZE, kappa))(keys)


def spearman(x, y) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def main(argv=None) -> dict:
    args = parse("conditioning", __doc__.splitlines()[0], argv)
    n_inits, kappas = (
        (8, (1.0, 5.0)) if args.small else (128, (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 50.0, 100.0))
    )
    t_long = 1e4 if args.small else T_LONG
    ts = np.unique(np.concatenate([np.minimum(pz.save_times(t_long, 60), t_long), [T_PAPER]]))
    k300 = int(np.nonzero(ts == T_PAPER)[0][0])
    model = pz.init_ensemble(args.seed, n_inits, tokens=SIZE, dim=SIZE, v_scale=1e-5, a_scale=1e-3)
    rows, numbers, per_kappa = [], {}, {}
    for kappa in kappas:
        objective = datasets(args.seed + 1, n_inits, kappa)
        # the stiff default; one block of exactly the ensemble (128, the default, in full
        # mode), so that --small's 8 inits are not padded to 128 (docs/concepts.md)
        traj = pz.flow(model, objective, ts=ts, t1=t_long, block_size=n_inits)
        s = pz.summarize(traj, objective)
        ok = s.final["ok"]
        mw, H, loss = s.series["max_weight"][ok], s.series["entropy"][ok], s.series["loss"][ok]
        # converged: loss below 1e-3 of its initial value
        t_conv = crossing_time(ts, -loss / loss[:, :1], -1e-3)
        t50, t90 = crossing_time(ts, mw, 0.5), crossing_time(ts, mw, 0.9)
        # rest: loss below 1e-8 of its start; the change in max weight from then to t_end
        rest = loss <= 1e-8 * loss[:, :1]
        reached = rest.any(axis=1)
        k_rest = np.argmax(rest, axis=1)
        after = (mw[:, -1] - mw[np.arange(len(mw)), k_rest])[reached]
        t_rest = ts[k_rest[reached]]
        per_kappa[kappa] = {"mw": mw, "H": H, "t_conv": t_conv, "final": mw[:, k300]}
        med = lambda x: float(np.median(x))
        rows.append(
            [
                kappa,
                int((~ok).sum()),
                med(mw[:, k300]),
                float(np.percentile(mw[:, k300], 10)),
                float(np.percentile(mw[:, k300], 90)),
                med(H[:, k300]),
                med(mw[:, -1]),
                med(t50),
                med(t90),
                float(np.mean(np.isfinite(t90))),
                med(t_conv),
                f"{int(reached.sum())}/{len(mw)}",
                med(t_rest) if len(t_rest) else float("inf"),
                med(after) if len(after) else float("nan"),
                float(np.percentile(np.abs(after), 90)) if len(after) else float("nan"),
                int(np.median(np.asarray(traj.steps)[ok])),
            ]
        )
        numbers[f"kappa={kappa:g}"] = {
            "median_max_weight_t300": med(mw[:, k300]),
            "max_weight_t300_10_90": [float(np.percentile(mw[:, k300], q)) for q in (10, 90)],
            "median_entropy_t300": med(H[:, k300]),
            "median_max_weight_t_end": med(mw[:, -1]),
            "median_t_cross_0.5": med(t50),
            "median_t_cross_0.9": med(t90),
            "median_t_converge": med(t_conv),
            "n_failed": int((~ok).sum()),
            "at_rest_fraction": float(np.mean(reached)),
            "median_t_rest": med(t_rest) if len(t_rest) else float("inf"),
            "median_max_weight_change_after_rest": med(after) if len(after) else float("nan"),
            "p90_abs_max_weight_change_after_rest": (
                float(np.percentile(np.abs(after), 90)) if len(after) else float("nan")
            ),
            "median_solver_steps": float(np.median(np.asarray(traj.steps)[ok])),
        }
    print(
        f"{n_inits} (dataset, init) pairs per kappa; exact flow; "
        "paper (one seed, t=300): 0.05 0.10 0.63 0.87 0.94 for kappa 1..5"
    )
    table(
        [
            "kappa",
            "failed",
            "max w t=300",
            "10%",
            "90%",
            "H t=300",
            "max w t_end",
            "t(0.5)",
            "t(0.9)",
            "share >0.9",
            "t conv",
            "at rest",
            "t rest",
            "dmaxw after rest",
            "90% |d|",
            "steps",
        ],
        rows,
    )
    t_conv_all = np.concatenate([r["t_conv"] for r in per_kappa.values()])
    final_all = np.concatenate([r["final"] for r in per_kappa.values()])
    finite = np.isfinite(t_conv_all)
    rho = spearman(np.log(t_conv_all[finite]), final_all[finite]) if finite.sum() > 2 else float("nan")
    print(f"Spearman correlation of log(time to converge) with max weight at t = 300, all kappas: {rho:.3f}")

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.3), constrained_layout=True)
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(kappas)))
    for kappa, c in zip(kappas, colors, strict=True):
        band(axes[0], ts[1:], per_kappa[kappa]["mw"][:, 1:], label=f"kappa = {kappa:g}", color=c)
        axes[2].scatter(
            per_kappa[kappa]["t_conv"], per_kappa[kappa]["final"], s=8, color=c, label=f"kappa = {kappa:g}"
        )
    axes[0].axvline(T_PAPER, color="k", ls=":", label="t = 300 (paper)")
    axes[0].set(xscale="log", xlabel="t", ylabel="max weight", title="max weight (median, 10-90%)")
    box = [per_kappa[k]["final"] for k in kappas]
    axes[1].boxplot(box, whis=(10, 90), showfliers=False)
    axes[1].set_xticks(range(1, len(kappas) + 1), [f"{k:g}" for k in kappas])
    paper = {1.0: 0.05, 2.0: 0.10, 3.0: 0.63, 4.0: 0.87, 5.0: 0.94}
    xs = [i + 1 for i, k in enumerate(kappas) if k in paper]
    axes[1].plot(xs, [paper[k] for k in kappas if k in paper], "r*", ms=10, label="paper, one seed")
    axes[1].set(xlabel="kappa = cond(X)", ylabel="max weight at t = 300", title="final polarization")
    axes[2].set(
        xscale="log",
        xlabel="time for loss to fall to 1e-3 of its start",
        ylabel="max weight at t = 300",
        title=f"slower convergence, more polarization (Spearman {rho:.2f})",
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, args, "conditioning.png")
    return finish(
        args, {"n_inits": n_inits, "t_end": t_long, "by_kappa": numbers, "spearman_logtconv_maxweight": rho}
    )


if __name__ == "__main__":
    main(sys.argv[1:])
