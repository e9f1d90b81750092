"""Figures: ensemble bands of polarization against time, on a logarithmic clock."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def bands(x: np.ndarray, ok: np.ndarray, q=(10, 50, 90)) -> np.ndarray:
    """Percentiles over the non-failed initializations at each time: (len(q), times)."""
    x = np.asarray(x)[np.asarray(ok, bool)]
    if x.shape[0] == 0:
        return np.full((len(q), np.asarray(x).shape[-1]), np.nan)
    return np.percentile(x, q, axis=0)


def plot_bands(arrays: dict, config, path: Path, *, title: str | None = None) -> Path:
    """Median and 10-90% band of max weight and entropy against time (log axis)."""
    ts = np.asarray(arrays["ts"])
    keep = ts > 0  # a log axis cannot show t = 0
    ok = arrays["ok"]
    unit = "t (gradient-flow time)" if config.method == "flow" else f"t = step x lr (lr={config.lr:g})"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    panels = [
        ("series_max_weight", "max weight  max_j p_j", (0, 1.02), 1.0 / config.tokens, "uniform 1/T"),
        ("series_entropy", "entropy  H(p)  [nats]", None, np.log(config.tokens), "uniform log T"),
    ]
    for ax, (key, label, ylim, ref, ref_label) in zip(axes, panels, strict=True):
        lo, mid, hi = bands(arrays[key], ok)
        ax.fill_between(ts[keep], lo[keep], hi[keep], alpha=0.3, label="10-90% of inits")
        ax.plot(ts[keep], mid[keep], lw=2, label="median")
        ax.axhline(ref, color="gray", ls=":", label=ref_label)
        ax.set_xscale("log")
        ax.set_xlabel(unit)
        ax.set_ylabel(label)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    n_ok = int(np.sum(ok))
    fig.suptitle(
        title
        or f"{config.norm} / {config.objective} / {config.method}: {n_ok} of {len(ok)} inits "
        f"(T={config.tokens}, d={config.dim}, seed {config.seed})"
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
