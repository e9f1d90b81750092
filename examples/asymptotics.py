"""The rate of polarization: 1 - max_j s_j ~ C / (log t)^2, measured on the exact flow to t = 1e40.

Softmax, logistic loss along b, V(0) = 0.1 N(0, 1), a(0) = 0. The flow is integrated in
tau = log(1 + t), so t = 1e40 costs a few hundred solver steps. Per initialization we fit
the slope of log(1 - s_max) against log log t over the late window t in [1e20, 1e40]
(it should approach -2), and C = (1 - s_max) (log t)^2 at t = 1e40, for several token
counts. For scale, we time plain GD (`pz.descend`, lr 0.1) on this machine and mark the
flow time t_day = 0.1 x steps/s x 86400 that one day of discrete steps would reach.

    python examples/asymptotics.py [--small] [--out DIR] [--seed S]
"""

import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

T1 = 1e40
WINDOW = (1e20, 1e40)
LOCAL_WINDOWS = ((1e3, 1e6), (1e6, 1e10), (1e10, 1e20), (1e20, 1e40))


def slope(ts, gap, lo, hi) -> np.ndarray:
    """Least-squares slope of log(gap) against log log t over lo <= t <= hi, per initialization."""
    keep = (ts >= lo) & (ts <= hi)
    x = np.log(np.log(ts[keep]))
    y = np.log(gap[:, keep])
    x = x - x.mean()
    return (y - y.mean(axis=1, keepdims=True)) @ x / np.sum(x**2)


def gd_steps_per_second(model, objective, steps: int) -> float:
    """Plain GD at lr 0.1 on one initialization: steps per second, compile excluded."""
    run = lambda: jax.block_until_ready(pz.descend(model, objective, 0.1, steps=steps, save_at=[0, steps]))
    run()  # compile
    start = time.perf_counter()
    run()
    return steps / (time.perf_counter() - start)


def main(argv=None) -> dict:
    args = parse("asymptotics", __doc__.splitlines()[0], argv)
    n_main, n_other, token_list, gd_steps = (
        (64, 64, (8,), 2000) if args.small else (1000, 250, (2, 4, 8, 16, 32), 200_000)
    )
    ts = np.minimum(pz.save_times(T1, 121), T1)  # expm1(log1p(t1)) can round above t1
    results = {}
    for tokens in token_list:
        objective = pz.random_direction(args.seed + 1, tokens)
        model = pz.init_ensemble(args.seed, n_main if tokens == 8 else n_other, tokens=tokens, dim=tokens)
        traj = pz.flow(model, objective, ts=ts, t1=T1, rtol=1e-10, atol=1e-12, max_steps=20_000)
        weights, ok = np.asarray(traj.weights), np.asarray(traj.ok)
        top = np.argmax(weights[:, -1], axis=-1)
        # 1 - s_max as the sum of the other weights: no cancellation near one.
        gap = np.sum(weights, axis=-1) - np.take_along_axis(weights, top[:, None, None], axis=-1)[..., 0]
        gap = np.maximum(gap, 1e-300)[ok]
        results[tokens] = {
            "ok": ok,
            "gap": gap,
            "slope": slope(ts, gap, *WINDOW),
            "C": gap[:, -1] * np.log(ts[-1]) ** 2,
            "local": [np.median(slope(ts, gap, lo, hi)) for lo, hi in LOCAL_WINDOWS],
        }
        if tokens == 8:
            main_model, main_objective = model, objective

    single = pz.ValueAttention(main_model.V[0], main_model.a[0])
    sps = gd_steps_per_second(single, main_objective, gd_steps)
    t_day = 0.1 * sps * 86400.0
    main_res = results[8]
    k_day = int(np.argmin(np.abs(np.log(ts + 1) - np.log(t_day))))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    keep = ts > 1
    band(axes[0], ts[keep], main_res["gap"][:, keep], label="1 - max weight (median, 10-90%)")
    c_med = float(np.median(main_res["C"]))
    axes[0].plot(ts[keep], c_med / np.log(ts[keep]) ** 2, "k--", label=f"C / (log t)^2, C = {c_med:.2f}")
    axes[0].axvline(t_day, color="red", ls=":", label=f"GD lr 0.1, one day here: t = {t_day:.1e}")
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="t",
        ylabel="1 - max_j s_j",
        title=f"T = d = 8, {len(main_res['C'])} inits",
    )
    axes[0].legend(fontsize=8)
    loglog = np.log(np.log(ts[keep]))
    local = np.diff(np.log(main_res["gap"][:, keep]), axis=1) / np.diff(loglog)
    band(axes[1], ts[keep][1:], local, label="d log(1 - s_max) / d log log t")
    axes[1].axhline(-2, color="k", ls="--", label="-2")
    axes[1].set(xscale="log", xlabel="t", ylabel="local slope", ylim=(-6, 1), title="local exponent")
    axes[1].legend(fontsize=8)
    for tokens, r in results.items():
        axes[2].hist(r["C"], bins=40, histtype="step", density=True, label=f"T = {tokens}")
    axes[2].set(
        xlabel="C = (1 - s_max) (log t)^2 at t = 1e40", ylabel="density", title="C over initializations"
    )
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    save(fig, args, "rate.png")

    rows = []
    for tokens, r in results.items():
        rows.append(
            [
                tokens,
                len(r["C"]),
                int((~r["ok"]).sum()),
                float(np.median(r["slope"])),
                float(np.percentile(r["slope"], 5)),
                float(np.percentile(r["slope"], 95)),
                float(np.median(r["C"])),
                float(np.percentile(r["C"], 10)),
                float(np.percentile(r["C"], 90)),
            ]
        )
    table(["T", "inits", "failed", "median slope", "5%", "95%", "median C", "C 10%", "C 90%"], rows)
    print("median local slope over t windows (T = 8):")
    table([f"[{lo:.0e}, {hi:.0e}]" for lo, hi in LOCAL_WINDOWS], [[float(x) for x in main_res["local"]]])
    gap_day = float(np.median(main_res["gap"][:, k_day]))
    print(
        f"GD (lr 0.1, one initialization, T = 8) on this machine: {sps:.3g} steps/s -> one day reaches "
        f"t = {t_day:.3g}; median 1 - s_max there {gap_day:.3g} "
        f"vs {np.median(main_res['gap'][:, -1]):.3g} at t = 1e40"
    )
    return finish(
        args,
        {
            "median_slope_T8": float(np.median(main_res["slope"])),
            "slope_window": list(WINDOW),
            "local_slopes_T8": {
                f"{lo:.0e}-{hi:.0e}": float(x)
                for (lo, hi), x in zip(LOCAL_WINDOWS, main_res["local"], strict=True)
            },
            "median_C": {str(t): float(np.median(r["C"])) for t, r in results.items()},
            "median_slope": {str(t): float(np.median(r["slope"])) for t, r in results.items()},
            "n_failed": int(sum((~r["ok"]).sum() for r in results.values())),
            "gd_steps_per_second": sps,
            "t_day": t_day,
            "median_gap_at_t_day": gap_day,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
