"""A study's comparison figure: one statistic per panel across the cells of its grid.

Against a grid key (`[plot] x`), each hitting time of `y` also gets a panel of its
survival curve: the fraction of inits that reached the level by t, per cell.
"""

from pathlib import Path

import numpy as np

from ..core._choices import PER_INIT, PROMPT_PER_INIT
from ..core._quantile import quantile
from ._pyplot import fixed_layout, log_scale, pyplot
from ._sweep import empty_figure, one_hot_fraction

#: Grid keys that count as replication (pooled in figures).
REPLICATES = ("seed",)


def per_init_key(y: str) -> str | None:
    """The per_init.npz array behind statistic `y` (None for an ensemble fraction)."""
    y = y.removeprefix("median_")
    if y.startswith(("time_to_", "rate_")):
        return y
    return f"final_{y}" if y in PER_INIT or y in PROMPT_PER_INIT else None


def plot_study(study, runs: list, path: Path) -> Path:
    """A study's comparison figure at `path`, from its finished cells `runs` ([(name, Run)]).

    `study` is a `polarize.runs.Study`: its grid, `x` and `y` choose the panels.
    """
    plt = pyplot()

    varied = [k for k in study.grid if k not in REPLICATES]
    if not runs:
        return empty_figure(path, f"study {study.name}: no cell finished")
    if study.x is not None:
        fig = _against_x(study, runs, plt)
    elif len(varied) == 2:
        fig = _heatmaps(study, runs, varied, plt)
    else:
        fig = _against_time(study, runs, plt)
    fig.suptitle(f"study {study.name}: {len(runs)} cells")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _values(runs: list, y: str) -> np.ndarray:
    """The per-initialization values of statistic y over the finished inits of `runs`."""
    key = per_init_key(y)
    return np.concatenate([np.asarray(r.arrays[key], float)[np.asarray(r.arrays["ok"], bool)] for r in runs])


def _point(runs: list, y: str) -> tuple[float, float, float]:
    """(median, q10, q90) of y over pooled runs; an ensemble fraction is pooled by init count."""
    if per_init_key(y) is None:
        values = [(r.summary.get(y), r.summary["n_inits"] - r.summary["n_failed"]) for r in runs]
        values = [(v, n) for v, n in values if v is not None and n > 0]
        if not values:
            return (np.nan,) * 3
        mean = sum(v * n for v, n in values) / sum(n for _, n in values)
        return mean, np.nan, np.nan
    x = _values(runs, y)
    if x.size == 0:
        return (np.nan,) * 3
    return tuple(np.nan if v is None else v for v in (quantile(x, 0.5), quantile(x, 0.1), quantile(x, 0.9)))


def _label(y: str) -> str:
    y = y.removeprefix("median_")
    if y.startswith("time_to_loss_"):
        return f"t(loss = {y.removeprefix('time_to_loss_')} L(0))"
    if y.startswith("time_to_"):
        return f"t(max weight = {y.removeprefix('time_to_')})"
    return y.replace("_", " ")


def _logarithmic(y: str) -> bool:
    return y.removeprefix("median_").startswith(("time_to_", "rate_C"))


def _groups(study, runs, keys) -> dict:
    """Finished runs grouped by their values of `keys` (seeds pooled)."""
    groups: dict = {}
    for _, run in runs:
        groups.setdefault(tuple(getattr(run.config, k) for k in keys), []).append(run)
    return groups


def hitting_statistics(ys) -> list[str]:
    """The hitting times among statistics `ys`: each gets a panel of its survival curve."""
    return [y for y in ys if y.removeprefix("median_").startswith("time_to_")]


def reached_by(times: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The fraction of `times` (one per finished init; inf where never reached) that are
    <= each t of `ts`: the empirical distribution of a hitting time censored at t1."""
    times = np.sort(np.asarray(times, float))
    return np.searchsorted(times, ts, side="right") / max(times.size, 1)


def percent(share: float) -> str:
    """`share` in whole percent, never rounded to 0% or 100% unless it is exactly that."""
    if 0 < share < 0.01:
        return "<1%"
    if 0.99 < share < 1:
        return ">99%"
    return f"{share:.0%}"


def _survival(ax, study, runs, y):
    """Per cell group (seeds pooled), the fraction of inits whose hitting time y is <= t:
    it reads where a median cannot (inf where fewer than half reached the level by t1)."""
    keys = [k for k in study.grid if k not in REPLICATES]
    groups = _groups(study, runs, keys)
    horizon = max(run.config.horizon() for _, run in runs)
    values = {key: _values(group, y) for key, group in groups.items()}
    positive = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in values.values()])
    start = positive.min() / 2 if positive.size else horizon * 1e-6
    ts = np.geomspace(start, horizon, 256)
    colors = pyplot().get_cmap("viridis")(np.linspace(0, 0.9, max(len(groups), 1)))
    for color, (key, v) in zip(colors, sorted(values.items()), strict=False):
        label = ", ".join(f"{k}={value}" for k, value in zip(keys, key, strict=True)) or "all cells"
        share = reached_by(v, ts)
        # curves that stay at 0 lie on each other: the legend says how many reached by t1
        ax.plot(ts, share, color=color, label=f"{label}: {percent(share[-1])} by t1")
    log_scale(ax, "x", minor=True)  # from the earliest crossing: a few decades
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("t" if runs[0][1].config.method == "flow" else "t = step x lr")
    ax.set_ylabel(f"fraction of inits with {_label(y)} <= t")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _against_x(study, runs, plt):
    others = [k for k in study.grid if k not in (study.x, *REPLICATES)]
    survival = hitting_statistics(study.y)
    panels = len(study.y) + len(survival)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    fixed_layout(fig)
    axes = np.atleast_1d(axes)
    for ax, y in zip(axes[len(study.y) :], survival, strict=True):
        _survival(ax, study, runs, y)
    lines = _groups(study, runs, others)
    for ax, y in zip(axes[: len(study.y)], study.y, strict=True):
        drawn, notes = [], []
        for key, group in lines.items():
            points = _groups(study, [(None, r) for r in group], [study.x])
            xs = sorted(points)
            stats = np.array([_point(points[x], y) for x in xs], dtype=float)
            never = [x[0] for x, v in zip(xs, stats[:, 0], strict=True) if np.isinf(v)]
            if never:
                notes.append(f"median not reached by t1 at {study.x} = {', '.join(map(str, never))}")
            stats[np.isinf(stats)] = np.nan  # never reached: nothing to draw
            label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or "median"
            xs = [x[0] for x in xs]
            drawn.append(stats[np.isfinite(stats[:, 0]), 0])
            (line,) = ax.plot(xs, stats[:, 0], marker="o", label=label)
            if np.isfinite(stats[:, 1:]).any():
                ax.fill_between(xs, stats[:, 1], stats[:, 2], color=line.get_color(), alpha=0.2)
        ax.set_xlabel(study.x)
        band = "" if per_init_key(y) is None else " (median, 10-90% band)"
        ax.set_ylabel(_label(y) + band)
        drawn = np.concatenate(drawn)
        if _logarithmic(y) and drawn.size and (drawn > 0).all():
            log_scale(ax, "y", minor=True)
        if not drawn.size:
            ax.text(0.5, 0.5, "median not reached in any cell", transform=ax.transAxes, ha="center")
        elif notes:
            ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="bottom")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _heatmaps(study, runs, varied, plt):
    from matplotlib.colors import LogNorm

    kx, ky = varied
    xs, ys = study.grid[kx], study.grid[ky]
    cells = _groups(study, runs, [kx, ky])
    fig, axes = plt.subplots(1, len(study.y), figsize=(6 * len(study.y), 4.5))
    fixed_layout(fig, gap=1.4)  # each panel's colorbar takes its room from its panel
    for ax, y in zip(np.atleast_1d(axes), study.y, strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for (vx, vy), group in cells.items():
            grid[ys.index(vy), xs.index(vx)] = _point(group, y)[0]
        finite = grid[np.isfinite(grid)]
        norm = LogNorm() if _logarithmic(y) and finite.size and (finite > 0).all() else None
        image = ax.imshow(
            np.ma.masked_invalid(grid), origin="lower", aspect="auto", norm=norm, cmap="viridis"
        )
        for (i, j), v in np.ndenumerate(grid):
            text = "n/a" if np.isnan(v) else "not reached" if np.isinf(v) else f"{v:.3g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
        ax.set_yticks(range(len(ys)), [str(v) for v in ys])
        ax.set_xlabel(kx)
        ax.set_ylabel(ky)
        fig.colorbar(image, ax=ax, label=("median " if per_init_key(y) else "") + _label(y))
    return fig


def _against_time(study, runs, plt):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    fixed_layout(fig)
    for name, run in runs:
        arrays, config = run.arrays, run.config
        ts, frac = one_hot_fraction(arrays, config.threshold)
        ok = arrays["ok"].astype(bool)
        med = np.median(arrays["series_max_weight"][ok], axis=0) if ok.any() else np.full(ts.shape, np.nan)
        keep = ts > 0
        axes[0].plot(ts[keep], med[keep], label=name)
        axes[1].plot(ts[keep], frac[keep], label=name)
    unit = "t" if runs[0][1].config.method == "flow" else "t = step x lr"
    for ax, label in zip(
        axes, ["median max weight", "one-hot fraction (max weight >= threshold)"], strict=True
    ):
        log_scale(ax, "x")
        ax.set_xlabel(unit)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    return fig
