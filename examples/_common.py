"""Plumbing shared by the example scripts: arguments, output folder, figures, tables, numbers."""

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def parse(name: str, doc: str, argv=None) -> argparse.Namespace:
    """--small (seconds, for the test suite), --out DIR (default runs/examples/<name>/), --seed."""
    parser = argparse.ArgumentParser(prog=f"{name}.py", description=doc)
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=Path("runs/examples") / name, help="folder for PNGs")
    parser.add_argument("--seed", type=int, default=0, help="base seed of data and initializations")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.start = time.perf_counter()
    return args


def save(fig, args, filename: str) -> Path:
    path = args.out / filename
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def finish(args, numbers: dict) -> dict:
    """Print the wall time, write numbers.json beside the figures and return the numbers."""
    numbers["wall_seconds"] = round(time.perf_counter() - args.start, 1)
    numbers["small"] = bool(args.small)
    (args.out / "numbers.json").write_text(json.dumps(numbers, indent=1, default=float) + "\n")
    print(f"numbers: {args.out / 'numbers.json'}  (wall {numbers['wall_seconds']} s)")
    return numbers


def table(headers: list[str], rows: list[list]) -> None:
    """Print a plain aligned table (floats with 4 significant digits)."""
    cells = [[f"{c:.4g}" if isinstance(c, float | np.floating) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def band(ax, ts, x, ok=None, label=None, color=None, q=(10, 50, 90)):
    """Median line and lo-hi percentile band of x (inits, times) over the ok initializations."""
    x = np.asarray(x) if ok is None else np.asarray(x)[np.asarray(ok, bool)]
    lo, mid, hi = np.percentile(x, q, axis=0)
    (line,) = ax.plot(ts, mid, lw=2, label=label, color=color)
    ax.fill_between(ts, lo, hi, alpha=0.25, color=line.get_color())
    return line


def crossing_time(ts: np.ndarray, x: np.ndarray, level: float) -> np.ndarray:
    """First saved time at which x (inits, times) reaches `level`, log-interpolated; inf if never."""
    ts, x = np.asarray(ts), np.asarray(x)
    above = x >= level
    first = np.argmax(above, axis=1)
    out = np.full(x.shape[0], np.inf)
    hit = above.any(axis=1)
    for i in np.nonzero(hit)[0]:
        k = first[i]
        if k == 0:
            out[i] = ts[0]
            continue
        x0, x1 = x[i, k - 1], x[i, k]
        w = (level - x0) / (x1 - x0) if x1 != x0 else 1.0
        out[i] = np.expm1((1 - w) * np.log1p(ts[k - 1]) + w * np.log1p(ts[k]))
    return out
