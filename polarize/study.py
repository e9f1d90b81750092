"""Studies: a grid of sweeps described in a TOML file, with a table and a comparison figure.

    name = "conditioning"
    [base]                       # SweepConfig settings shared by every cell
    objective = "square"
    [grid]                       # every combination is one cell (a resumable sweep)
    kappa = [1.0, 3.0, 10.0]
    seed = [0, 1]
    [plot]                       # optional
    x = "kappa"                  # a grid key
    y = ["time_to_0.9", "max_weight"]   # statistics, one panel each

Statistics for `y`: any per-initialization statistic a sweep stores (`max_weight`,
`entropy`, `eff_tokens`, `top_share`, `loss`, `time_to_<level>`, `time_to_loss_<f>`,
`rate_C`, `rate_drift`), drawn as the median over finished initializations with a
10-90% band (log axis for times and rates), or an ensemble fraction
(`one_hot_fraction`, `fraction_reached_<level>`, ...), drawn as a line. The grid key
`seed` counts as replication: cells that differ only in seed are pooled.

The figure (comparison.png): with `x`, the statistics against it, one line per value
of the other grid keys; without `x`, a grid over two keys is a heatmap of each
statistic's median; otherwise the cells' median max weight and one-hot fraction
against time.

A cell that cannot run (an invalid setting) or whose sweep failed for more than half
of its initializations is reported in study.csv (`status`, `error`) and in the
study's summary.json; the other cells go on.
"""

import dataclasses
import itertools
import re
import tomllib
from pathlib import Path

import numpy as np

from .config import SweepConfig
from .devices import barrier
from .errors import PolarizeError
from .results import Run, failed_too_many, failure_line, load
from .statistics import quantile
from .storage import read_json, write_json
from .sweep import resumed_config, run_sweep, stored_config

#: Per-initialization statistics a study can plot (besides time_to_* of the cell's levels).
PER_INIT = ("max_weight", "entropy", "eff_tokens", "top_share", "loss", "rate_C", "rate_drift")
#: Ensemble fractions from summary.json a study can plot (besides fraction_reached_*).
FRACTIONS = ("one_hot_fraction", "order_preserved_fraction", "winner_is_argmax_u0_fraction")
#: Grid keys that count as replication (pooled in figures).
REPLICATES = ("seed",)


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    base: dict
    grid: dict
    x: str | None = None
    y: tuple[str, ...] = ("max_weight",)

    def settings(self) -> list[tuple[str, dict]]:
        """(cell name, its settings) for every combination of the grid, in file order."""
        keys = list(self.grid)
        out = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            setting = dict(zip(keys, values, strict=True))
            name = "__".join(f"{k}={v}" for k, v in setting.items()) or "base"
            out.append((re.sub(r"[^A-Za-z0-9_.=+-]", "_", name), {**self.base, **setting}))
        return out

    def cells(self) -> list[tuple[str, SweepConfig | PolarizeError]]:
        """(cell name, config) per cell; the error instead where a cell's settings are invalid."""
        out = []
        for name, setting in self.settings():
            try:
                out.append((name, SweepConfig(**setting)))
            except PolarizeError as e:
                out.append((name, e))
        return out

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "y": list(self.y)}


def statistic_names(config: SweepConfig) -> list[str]:
    """The statistics a study can plot for cells with this config."""
    times = config.time_names()
    reached = [f"fraction_reached_{n.removeprefix('time_to_')}" for n in times]
    return [*PER_INIT, *times, *FRACTIONS, *reached]


def _per_init_key(y: str) -> str | None:
    """The per_init.npz array behind statistic `y` (None for an ensemble fraction)."""
    y = y.removeprefix("median_")
    if y.startswith(("time_to_", "rate_")):
        return y
    return f"final_{y}" if y in PER_INIT else None


def load_study(path) -> Study:
    """Read and validate a study file (a cell's invalid value fails that cell only, at run time)."""
    path = Path(path)
    if not path.exists():
        raise PolarizeError(f"study file {path} does not exist")
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PolarizeError(f"study file {path} is not valid TOML: {e}") from None
    unknown = sorted(set(spec) - {"name", "base", "grid", "plot"})
    if unknown:
        raise PolarizeError(f"study file {path}: unknown section(s) {unknown}; valid: name, base, grid, plot")
    valid = {f.name for f in dataclasses.fields(SweepConfig)}
    base, grid, plot = spec.get("base", {}), spec.get("grid", {}), spec.get("plot", {})
    for section, keys in (("base", base), ("grid", grid)):
        bad = sorted(set(keys) - valid)
        if bad:
            raise PolarizeError(
                f"study file {path}: unknown setting(s) {bad} in [{section}]; valid: {sorted(valid)}"
            )
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise PolarizeError(f"study file {path}: [grid] {key} must be a non-empty list")
    bad = sorted(set(plot) - {"x", "y"})
    if bad:
        raise PolarizeError(f"study file {path}: unknown [plot] key(s) {bad}; valid: x, y")
    x = plot.get("x")
    if x is not None and x not in grid:
        raise PolarizeError(f"study file {path}: [plot] x = {x!r} must be one of the grid keys {list(grid)}")
    y = plot.get("y", "max_weight")
    y = tuple([y] if isinstance(y, str) else y)
    study = Study(str(spec.get("name", path.stem)), base, grid, x, y)
    configs = [c for _, c in study.cells() if isinstance(c, SweepConfig)]
    if configs:
        names = statistic_names(configs[0])
        for stat in y:
            if stat not in names and stat.removeprefix("median_") not in names:
                raise PolarizeError(
                    f"study file {path}: [plot] y = {stat!r} is not a statistic; valid: {', '.join(names)}"
                )
    return study


def run_study(study: Study, out, *, progress: bool = False) -> dict:
    """Run (or continue) every cell under out/cells/, then write study.csv, summary.json, comparison.png.

    Returns the study's summary: {"cells", "failed_cells": {name: reason}}. A failing
    cell does not stop the others.
    """
    import jax

    out = Path(out)
    spec = out / "study.json"
    if spec.exists() and read_json(spec) != _json_roundtrip(study.to_dict()):
        raise PolarizeError(f"{out} holds a different study; choose another --out")
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_json(spec, study.to_dict())
    barrier("polarize-study-start")
    failed = {}
    for name, config in study.cells():
        if isinstance(config, PolarizeError):
            failed[name] = f"invalid setting: {config}"
            continue
        cell = out / "cells" / name
        if not ((cell / "summary.json").exists() and stored_config(cell) == resumed_config(config, cell)):
            try:
                run_sweep(config, cell, resume=(cell / "config.json").exists(), progress=progress)
            except PolarizeError as e:
                failed[name] = str(e)
                continue
            finally:
                barrier(f"polarize-study-{name}")
        summary = read_json(cell / "summary.json")
        if failed_too_many(summary):
            failed[name] = failure_line(summary)
    result = {"cells": len(study.settings()), "failed_cells": failed}
    if jax.process_index() == 0:
        write_json(out / "summary.json", result)
        write_table(study, out, failed)
        plot_study(study, out)
    return result


def _json_roundtrip(d: dict) -> dict:
    import json

    return json.loads(json.dumps(d))


def _finished_runs(study: Study, out: Path) -> list[tuple[str, Run]]:
    runs = []
    for name, _ in study.settings():
        if (out / "cells" / name / "summary.json").exists():
            runs.append((name, load(out / "cells" / name)))
    return runs


def write_table(study: Study, out: Path, failed: dict):
    """study.csv: one row per cell, its grid values, status, error and every summary number."""
    import pandas as pd

    runs = dict(_finished_runs(study, out))
    rows = []
    for name, setting in study.settings():
        row = {"cell": name, **{k: setting[k] for k in study.grid}}
        row["status"] = "failed" if name in failed else "ok"
        row["error"] = failed.get(name, "")
        if name in runs:
            row.update(runs[name].summary)
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(out / "study.csv", index=False)
    return table


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """A study folder: its `study`, `table` (study.csv, one row per cell) and finished `runs`."""

    folder: Path
    study: Study
    table: object
    runs: dict

    def frame(self):
        """Every finished cell's initializations (`Run.frame`), with `cell` and the grid keys first."""
        import pandas as pd

        frames = []
        for name, run in self.runs.items():
            frame = run.frame()
            frame.insert(0, "cell", name)
            frames.append(frame)
        frame = pd.concat(frames, ignore_index=True)
        first = ["cell", *self.study.grid]
        return frame[first + [c for c in frame.columns if c not in first]]


def load_result(out) -> StudyResult:
    """A study folder, read without recomputing anything."""
    import pandas as pd

    out = Path(out)
    spec = read_json(out / "study.json")
    study = Study(**{**spec, "y": tuple(spec.get("y", ("max_weight",)))})
    if not (out / "study.csv").exists():
        raise PolarizeError(f"`dir` {out} holds an unfinished study (no study.csv); rerun it first")
    return StudyResult(out, study, pd.read_csv(out / "study.csv"), dict(_finished_runs(study, out)))


def plot_study(study: Study, out: Path) -> Path:
    """comparison.png across cells, from stored results only."""
    import matplotlib.pyplot as plt

    runs = _finished_runs(study, out)
    varied = [k for k in study.grid if k not in REPLICATES]
    path = out / "comparison.png"
    if not runs:
        from .plots import empty_figure

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


def _values(runs: list[Run], y: str) -> np.ndarray:
    """The per-initialization values of statistic y over the finished inits of `runs`."""
    key = _per_init_key(y)
    return np.concatenate([np.asarray(r.arrays[key], float)[np.asarray(r.arrays["ok"], bool)] for r in runs])


def _point(runs: list[Run], y: str) -> tuple[float, float, float]:
    """(median, q10, q90) of y over pooled runs; an ensemble fraction is pooled by init count."""
    if _per_init_key(y) is None:
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


def _groups(study: Study, runs, keys) -> dict:
    """Finished runs grouped by their values of `keys` (seeds pooled)."""
    groups: dict = {}
    for _, run in runs:
        groups.setdefault(tuple(getattr(run.config, k) for k in keys), []).append(run)
    return groups


def _against_x(study: Study, runs, plt):
    others = [k for k in study.grid if k not in (study.x, *REPLICATES)]
    fig, axes = plt.subplots(1, len(study.y), figsize=(6 * len(study.y), 4.5), constrained_layout=True)
    axes = np.atleast_1d(axes)
    lines = _groups(study, runs, others)
    for ax, y in zip(axes, study.y, strict=True):
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
        band = "" if _per_init_key(y) is None else " (median, 10-90% band)"
        ax.set_ylabel(_label(y) + band)
        drawn = np.concatenate(drawn)
        if _logarithmic(y) and drawn.size and (drawn > 0).all():
            ax.set_yscale("log")
        if not drawn.size:
            ax.text(0.5, 0.5, "median not reached in any cell", transform=ax.transAxes, ha="center")
        elif notes:
            ax.text(0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=7, va="bottom")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def _heatmaps(study: Study, runs, varied, plt):
    from matplotlib.colors import LogNorm

    kx, ky = varied
    xs, ys = study.grid[kx], study.grid[ky]
    cells = _groups(study, runs, [kx, ky])
    fig, axes = plt.subplots(1, len(study.y), figsize=(6 * len(study.y), 4.5), constrained_layout=True)
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
        fig.colorbar(image, ax=ax, label=("median " if _per_init_key(y) else "") + _label(y))
    return fig


def _against_time(study: Study, runs, plt):
    from .plots import one_hot_fraction

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
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
        ax.set_xscale("log")
        ax.set_xlabel(unit)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    return fig
