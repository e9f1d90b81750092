"""Figures: ensemble bands of polarization against time, on a logarithmic clock."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..core._choices import cpu_threads
from ._pyplot import log_scale, pyplot

#: Fixed margins (inches' fractions) that fit the axis labels: measured, constrained
#: layout took 0.6 s of each figure's 0.9 s on a 2-core CPU.
MARGINS = dict(left=0.11, right=0.97, bottom=0.13, top=0.9)


def bands(x: np.ndarray, ok: np.ndarray, q=(10, 50, 90)) -> np.ndarray:
    """Percentiles over the non-failed initializations at each time: (len(q), times)."""
    x, ok = np.asarray(x), np.asarray(ok, bool)
    if not ok.any():
        return np.full((len(q), x.shape[-1]), np.nan)
    # one time at a time: a copy of one column, not of the whole (inits, times) array
    return np.stack(_per_column(lambda j: np.percentile(x[:, j][ok], q), x.shape[-1]), axis=-1)


def _per_column(fn, n: int) -> list:
    """[fn(0), ..., fn(n - 1)] on the CPU threads (numpy's gathers and partitions let go
    of the GIL: at 1e6 inits the percentiles of a sweep's figures take half the time)."""

    with ThreadPoolExecutor(cpu_threads()) as pool:
        return list(pool.map(fn, range(n)))


def plot_bands(arrays: dict, config, path: Path, *, title: str | None = None) -> Path:
    """Median and 10-90% band of max weight and entropy against time (log axis)."""
    plt = pyplot()
    ts = np.asarray(arrays["snap_ts"])
    keep = ts > 0  # a log axis cannot show t = 0
    ok = arrays["ok"]
    unit = _time_label(config)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.88, wspace=0.22)
    # prompt attention: the least polarized sample (`measure._selection.weight_statistics`)
    prompt = getattr(config, "model", "value") == "prompt"
    panels = [
        (
            "series_max_weight",
            "max weight  min_i max_t p_it" if prompt else "max weight  max_j p_j",
            (0, 1.02),
            1.0 / config.tokens,
            "uniform 1/T",
            "upper left",
        ),
        (
            "series_entropy",
            "entropy  max_i H(p_i)  [nats]" if prompt else "entropy  H(p)  [nats]",
            None,
            np.log(config.tokens),
            "uniform log T",
            "lower left",
        ),
    ]
    # the legends sit where the curves start (near uniform): max weight low, entropy high
    for ax, (key, label, ylim, ref, ref_label, corner) in zip(axes, panels, strict=True):
        lo, mid, hi = bands(arrays[key], ok)
        ax.fill_between(ts[keep], lo[keep], hi[keep], alpha=0.3, label="10-90% of inits")
        ax.plot(ts[keep], mid[keep], lw=2, label="median")
        ax.axhline(ref, color="gray", ls=":", label=ref_label)
        log_scale(ax, "x")
        ax.set_xlabel(unit)
        ax.set_ylabel(label)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(loc=corner, fontsize=8)
    n_ok = int(np.sum(ok))
    fig.suptitle(
        title
        or f"{config.norm} / {config.objective} / {config.method}: {n_ok} of {len(ok)} inits "
        f"(T={config.tokens}, d={config.dim}, seed {config.seed})"
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _time_label(config) -> str:
    return "t (gradient-flow time)" if config.method == "flow" else f"t = step x lr (lr={config.lr:g})"


def plot_entropy_histogram(arrays: dict, config, path: Path) -> Path:
    """Histogram of the final entropy over the non-failed initializations."""
    plt = pyplot()
    ok = np.asarray(arrays["ok"], bool)
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(**MARGINS)
    ax.hist(arrays["final_entropy"][ok], bins=50, range=(0, np.log(config.tokens)), color="C0")
    ax.axvline(np.log(config.tokens), color="gray", ls=":", label="uniform log T")
    ax.set_xlabel("final entropy H(p) [nats]")
    ax.set_ylabel("initializations")
    ax.set_title(f"final entropy, {ok.sum()} inits ({config.norm}/{config.objective})")
    # polarized inits pile up at the left, unpolarized ones at the line: the middle is free
    ax.legend(loc="upper center", fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_winner_histogram(arrays: dict, config, path: Path) -> Path:
    """How often each token ends with the largest weight."""
    plt = pyplot()
    ok = np.asarray(arrays["ok"], bool)
    counts = np.bincount(arrays["final_winner"][ok].astype(int), minlength=config.tokens)
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(**MARGINS)
    ax.bar(np.arange(config.tokens), counts, color="C1")
    ax.axhline(ok.sum() / config.tokens, color="gray", ls=":", label="uniform")
    ax.set_xlabel("winning token index j = argmax p_j at the final time")
    ax.set_ylabel("initializations")
    ax.set_title("winner index")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def one_hot_fraction(arrays: dict, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(times, fraction of non-failed initializations with max weight >= threshold)."""
    ok = np.asarray(arrays["ok"], bool)
    mw = np.asarray(arrays["series_max_weight"])
    # one time at a time: no (inits, times) temporaries
    above = np.array(_per_column(lambda j: np.count_nonzero(mw[:, j][ok] >= threshold), mw.shape[1]))
    frac = above / ok.sum() if ok.any() else np.full(mw.shape[1], np.nan)
    return np.asarray(arrays["snap_ts"]), frac


def plot_one_hot_fraction(arrays: dict, config, path: Path) -> Path:
    """Fraction of initializations whose max weight is above the threshold, against time."""
    plt = pyplot()
    ts, frac = one_hot_fraction(arrays, config.threshold)
    keep = ts > 0
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(**MARGINS)
    ax.plot(ts[keep], frac[keep], marker=".")
    log_scale(ax, "x")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(_time_label(config))
    ax.set_ylabel(f"fraction with max weight >= {config.threshold:g}")
    ax.set_title("one-hot fraction against time")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_selections(arrays: dict, config, path: Path, *, most: int = 12) -> Path:
    """How often each selection (the token each sample selects at the last time) is reached,
    the `most` commonest; a selection of the best-score tokens marked (prompt attention)."""
    plt = pyplot()
    ok = np.asarray(arrays["ok"], bool)
    selected, all_best = np.asarray(arrays["final_selected"])[ok], np.asarray(arrays["final_all_best"])[ok]
    unique, inverse, counts = np.unique(selected, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(-counts, kind="stable")[:most]
    names = ["-".join(str(int(t)) for t in unique[k]) for k in order]
    is_best = [bool(np.any(all_best[inverse == k])) for k in order]
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.25, top=0.9)
    ax.bar(np.arange(len(order)), counts[order], color=["C2" if b else "C1" for b in is_best])
    ax.set_xticks(np.arange(len(order)), names, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("selection (selected token of each sample), green: the best-score tokens")
    ax.set_ylabel("initializations")
    ax.set_title(
        f"{len(unique)} selections at the last time; "
        f"the best-score tokens: {all_best.sum()} of {ok.sum()} inits",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_svm_alignment(arrays: dict, config, path: Path) -> Path:
    """1 - cos(p(t), p_mm) with the attention SVM of each initialization's selection against
    t: median and 10-90% band over the finished initializations whose selection is feasible
    (prompt attention)."""
    plt = pyplot()
    ts = np.asarray(arrays["snap_ts"])
    keep = ts > 0
    use = np.asarray(arrays["ok"], bool) & np.asarray(arrays["final_feasible"], bool)
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(**MARGINS)
    gap = 1.0 - np.asarray(arrays["series_cos_selected"], np.float64)
    lo, mid, hi = bands(gap, use)
    ax.fill_between(ts[keep], lo[keep], hi[keep], alpha=0.3, label="10-90% of inits")
    ax.plot(ts[keep], mid[keep], lw=2, label="median")
    log_scale(ax, "x")
    log_scale(ax, "y", minor=True)
    ax.set_xlabel(_time_label(config))
    ax.set_ylabel("1 - cos(p, p_mm of the selection)")
    ax.set_title(f"alignment with the attention SVM, {use.sum()} inits")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def figure_list(config) -> list[tuple]:
    """(draw, file name) of every figure of a sweep of `config`."""
    common = [(plot_bands, "weights.png"), (plot_entropy_histogram, "entropy_hist.png")]
    if getattr(config, "model", "value") == "prompt":
        own = [(plot_selections, "selections.png"), (plot_svm_alignment, "svm_alignment.png")]
    else:
        own = [(plot_winner_histogram, "winners.png")]
    return common + own + [(plot_one_hot_fraction, "one_hot_fraction.png")]


def sweep_figures(arrays: dict, config, out: Path, only=None) -> list[Path]:
    """Every figure of a sweep folder (or those named in `only`), from its stored arrays
    (`figure_list`).

    Only finished initializations are drawn; with none, each figure says so instead.
    """
    out = Path(out)
    figures = [f for f in figure_list(config) if only is None or f[1] in only]
    if not np.any(arrays["ok"]):
        note = f"no initialization finished ({len(arrays['ok'])} failed): nothing to draw"
        return [empty_figure(out / name, note) for _, name in figures]
    return [draw(arrays, config, out / name) for draw, name in figures]


def empty_figure(path: Path, note: str) -> Path:
    """A figure holding only `note` (where there is no data to draw)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    fig.subplots_adjust(**MARGINS)
    ax.text(0.5, 0.5, note, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
