"""The paper's central figure, then the same over an ensemble of initializations.

Logistic loss along a unit direction b, softmax, V(0) = 0.1 N(0, 1), a(0) = 0, exact flow.
One initialization: sigma(a) against t (log-log) and the value projections u = V^T b
against log t. Ensemble (10^4 initializations): bands of max weight and entropy, the
share with preserved order, the share whose winner is argmax u(0), and V's top
singular share s_1^2 / sum s_i^2 over time.

    python examples/logistic_polarization.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

TOKENS = DIM = 8


def single_figure(args, traj, objective, ts) -> None:
    """The paper's figure for initialization 0 (identical to a run of that one initialization)."""
    s = np.asarray(traj.weights)
    u = np.einsum("tdk,d->tk", np.asarray(traj.V), np.asarray(objective.b))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for j in np.argsort(-u[0]):
        axes[0].loglog(ts[1:], s[1:, j], label=f"token {j}")
        axes[1].plot(ts[1:], u[1:, j])
    axes[0].set(xlabel="t", ylabel="weight  sigma(a)_j", title="one initialization: weights")
    axes[1].set(xscale="log", xlabel="t", ylabel="u_j = <b, v_j>", title="value projections (no crossings)")
    axes[0].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    save(fig, args, "single.png")


def main(argv=None) -> dict:
    args = parse("logistic_polarization", __doc__.splitlines()[0], argv)
    n_inits, chunk, t1 = (128, 128, 1e8) if args.small else (10_000, 2000, 1e12)
    objective = pz.random_direction(args.seed + 1, DIM)
    ts = np.minimum(pz.save_times(t1, 49), t1)  # expm1(log1p(t1)) can round above t1

    # The ensemble, in chunks (initialization i depends only on (seed, i)).
    keys = ("max_weight", "entropy", "top_share")
    series = {k: [] for k in keys}
    ok, preserved, winner = [], [], []
    for start in range(0, n_inits, chunk):
        model = pz.init_ensemble(args.seed, min(chunk, n_inits - start), tokens=TOKENS, dim=DIM, start=start)
        traj = pz.flow(model, objective, ts=ts, t1=t1)
        if start == 0:
            single_figure(args, traj.at(0), objective, ts)
        summary = pz.summarize(traj, objective)
        for k in keys:
            series[k].append(summary.series[k])
        ok.append(summary.final["ok"])
        preserved.append(summary.final["order_preserved"])
        winner.append(summary.final["winner_is_argmax_u0"])
    series = {k: np.concatenate(v) for k, v in series.items()}
    ok, preserved, winner = (np.concatenate(x) for x in (ok, preserved, winner))

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for ax, k, label, ref in zip(
        axes,
        keys,
        ("max weight", "entropy [nats]", "V top singular share"),
        (1 / TOKENS, np.log(TOKENS), None),
        strict=True,
    ):
        band(ax, ts[1:], series[k][:, 1:], ok, label="median, 10-90%")
        if ref is not None:
            ax.axhline(ref, color="gray", ls=":", label="uniform")
        ax.set(xscale="log", xlabel="t (flow time)", ylabel=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"softmax, logistic along b: {int(ok.sum())} of {ok.size} initializations (T = d = {TOKENS})"
    )
    save(fig, args, "ensemble.png")

    checkpoints = [t for t in (1e2, 1e4, 1e6, 1e8, 1e10, 1e12) if t <= t1]
    rows = []
    for t in checkpoints:
        k = int(np.argmin(np.abs(np.log(ts + 1) - np.log(t + 1))))
        mw = series["max_weight"][ok, k]
        rows.append(
            [
                f"{ts[k]:.3g}",
                float(np.median(mw)),
                float(np.percentile(mw, 10)),
                float(np.mean(mw >= 0.9)),
                float(np.median(series["entropy"][ok, k])),
                float(np.median(series["top_share"][ok, k])),
            ]
        )
    table(["t", "median max w", "10% max w", "share >= 0.9", "median H", "median top share"], rows)
    numbers = {
        "n_inits": int(ok.size),
        "n_failed": int((~ok).sum()),
        "t1": t1,
        "order_preserved_fraction": float(preserved[ok].mean()),
        "winner_is_argmax_u0_fraction": float(winner[ok].mean()),
        "final_median_max_weight": float(np.median(series["max_weight"][ok, -1])),
        "final_one_hot_fraction": float(np.mean(series["max_weight"][ok, -1] >= 0.9)),
        "final_median_top_share": float(np.median(series["top_share"][ok, -1])),
    }
    print(
        f"order preserved: {numbers['order_preserved_fraction']:.4f} of inits; "
        f"winner = argmax u(0): {numbers['winner_is_argmax_u0_fraction']:.4f}; "
        f"failed: {numbers['n_failed']}"
    )
    return finish(args, numbers)


if __name__ == "__main__":
    main(sys.argv[1:])
