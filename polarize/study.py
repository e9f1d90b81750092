"""Studies: a grid of sweeps described in a TOML file, with a table and a comparison figure.

    name = "normalizations"
    [base]                       # SweepConfig settings shared by every cell
    objective = "logistic"
    tokens = 10
    [grid]                       # every combination is one cell (a resumable sweep)
    norm = ["softmax", "sigmoid"]
    [plot]                       # optional: metric of summary.json against one grid key
    x = "kappa"
    metric = "median_max_weight"

Without [plot].x the comparison figure shows each cell's median max weight and
one-hot fraction against time.
"""

import csv
import dataclasses
import itertools
import re
import tomllib
from pathlib import Path

from .errors import PolarizeError
from .storage import read_json, write_json
from .config import SweepConfig
from .results import load
from .sweep import run_sweep, stored_config


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    base: dict
    grid: dict
    x: str | None = None
    metric: str = "median_max_weight"

    def cells(self) -> list[tuple[str, SweepConfig]]:
        """(cell name, config) for every combination of the grid, in file order."""
        keys = list(self.grid)
        out = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            setting = dict(zip(keys, values, strict=True))
            name = "__".join(f"{k}={v}" for k, v in setting.items()) or "base"
            out.append((re.sub(r"[^A-Za-z0-9_.=+-]", "_", name), SweepConfig(**{**self.base, **setting})))
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_study(path) -> Study:
    """Read and validate a study file."""
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
    x = plot.get("x")
    if x is not None and x not in grid:
        raise PolarizeError(f"study file {path}: [plot] x = {x!r} must be one of the grid keys {list(grid)}")
    study = Study(str(spec.get("name", path.stem)), base, grid, x, plot.get("metric", "median_max_weight"))
    study.cells()  # validates every cell's settings now, not halfway through the run
    return study


def run_study(study: Study, out, *, progress: bool = False) -> list[dict]:
    """Run (or continue) every cell under out/cells/, then write study.csv and comparison.png."""
    out = Path(out)
    spec = out / "study.json"
    if spec.exists() and read_json(spec) != _json_roundtrip(study.to_dict()):
        raise PolarizeError(f"{out} holds a different study; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json(spec, study.to_dict())
    for name, config in study.cells():
        cell = out / "cells" / name
        if (cell / "summary.json").exists() and stored_config(cell) == config:
            continue
        run_sweep(config, cell, resume=(cell / "config.json").exists(), progress=progress)
    table = write_table(study, out)
    plot_study(study, out)
    return table


def _json_roundtrip(d: dict) -> dict:
    import json

    return json.loads(json.dumps(d))


def write_table(study: Study, out: Path) -> list[dict]:
    """study.csv: one row per cell, its grid values and every summary number."""
    rows = []
    for name, _ in study.cells():
        run = load(out / "cells" / name)
        row = {"cell": name, **{k: getattr(run["config"], k) for k in study.grid}, **run["summary"]}
        rows.append(row)
    with open(out / "study.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def plot_study(study: Study, out: Path) -> Path:
    """comparison.png across cells, from stored results only."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .plots import one_hot_fraction

    runs = [(name, load(out / "cells" / name)) for name, _ in study.cells()]
    if study.x is not None:
        fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
        others = [k for k in study.grid if k != study.x]
        groups: dict = {}
        for _, run in runs:
            label = ", ".join(f"{k}={getattr(run['config'], k)}" for k in others) or study.metric
            groups.setdefault(label, []).append(
                (getattr(run["config"], study.x), run["summary"][study.metric])
            )
        for label, points in groups.items():
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, [np.nan if y is None else y for y in ys], marker="o", label=label)
        ax.set_xlabel(study.x)
        ax.set_ylabel(study.metric.replace("_", " "))
        ax.legend(fontsize=7)
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
        for name, run in runs:
            arrays, config = run["arrays"], run["config"]
            ts, frac = one_hot_fraction(arrays, config.threshold)
            ok = arrays["ok"].astype(bool)
            med = (
                np.median(arrays["series_max_weight"][ok], axis=0) if ok.any() else np.full(ts.shape, np.nan)
            )
            keep = ts > 0
            axes[0].plot(ts[keep], med[keep], label=name)
            axes[1].plot(ts[keep], frac[keep], label=name)
        unit = "t" if runs[0][1]["config"].method == "flow" else "t = step x lr"
        for ax, label in zip(
            axes, ["median max weight", "one-hot fraction (max weight >= threshold)"], strict=True
        ):
            ax.set_xscale("log")
            ax.set_xlabel(unit)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7)
    fig.suptitle(f"study {study.name}: {len(runs)} cells")
    path = out / "comparison.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
