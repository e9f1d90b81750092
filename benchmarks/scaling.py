"""Scaling of the flow ensemble: wall time against N, tokens, dim, horizon t1 and block size;
float32 against float64; first-call compile time and peak memory apart from steady state.

The logistic toy of flow_ensemble.py (defaults N = 1024, T = dim = 8, t1 = 1e5,
rtol 1e-6, atol 1e-8). Figures: benchmarks/scaling_*.png.

    python benchmarks/scaling.py            # full (a few minutes)
    python benchmarks/scaling.py --quick    # smoke test
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import polarize as pz  # noqa: E402
from benchmarks._common import fmt, record, table, timed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run(n=1024, tokens=8, dim=8, t1=1e5, block_size=None, precision=None, repeats=2):
    model = pz.init_ensemble(0, n, tokens=tokens, dim=dim, v_scale=0.1)
    obj = pz.random_direction(1, dim)
    fn = lambda: pz.flow(model, obj, t1=t1, n_save=2, block_size=block_size, precision=precision)  # noqa: E731
    first, best, tr = timed(fn, repeats=repeats)
    return first, best, tr


def sweep(name, values, **fixed):
    rows = []
    for v in values:
        first, best, tr = run(**{name: v}, **fixed)
        steps = np.asarray(tr.steps)
        rows.append((v, best, first - best, float(steps.mean()), int(steps.max()), bool(np.all(tr.ok))))
        print(name, rows[-1], flush=True)
    return rows


def plot(rows, name, xlabel, path, loglog=True):
    x = np.array([r[0] for r in rows], dtype=float)
    y = np.array([r[1] for r in rows])
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot(x, y, "o-")
    ax.set_xscale("log")
    if loglog:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("steady wall time (s)")
    ax.set_title(f"flow ensemble: time vs {name}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def slope(rows):
    x, y = np.log([r[0] for r in rows]), np.log([r[1] for r in rows])
    return float(np.polyfit(x, y, 1)[0])


def memory(n, kind):
    """First-call, steady and peak RSS of one fresh process running one configuration."""
    code = f"""
import json, sys, jax
sys.path.insert(0, {ROOT!r})
jax.config.update("jax_enable_x64", True)
import polarize as pz
from benchmarks._common import timed, peak_rss_mb
base = peak_rss_mb()
m, o = pz.init_ensemble(0, {n}, tokens=8, dim=8, v_scale=0.1), pz.random_direction(1, 8)
if {kind!r} == "flow":
    fn = lambda: pz.flow(m, o, t1=1e5, n_save=2)
else:
    fn = lambda: pz.descend(m, o, 0.1, steps=1000, save_at=[0, 1000])
first, best, _ = timed(fn, repeats=2)
print(json.dumps(dict(first=first, steady=best, base=base, peak=peak_rss_mb())))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; does not write RESULTS.md")
    args = parser.parse_args(argv)
    q = args.quick
    ns = [128, 256] if q else [256, 1024, 4096, 16384, 65536]
    toks = [8, 16] if q else [8, 32, 128, 256]
    dims = [8, 16] if q else [8, 32, 128, 256]
    horizons = [1e2, 1e30] if q else [1e2, 1e5, 1e10, 1e20, 1e30]
    blocks = [64, 128] if q else [64, 128, 256, 512, 1024, 2048]
    small = 128 if q else 1024

    by_n = sweep("n", ns)
    by_tokens = sweep("tokens", toks, n=small)
    by_dim = sweep("dim", dims, n=small)
    by_t1 = sweep("t1", horizons, n=small)
    by_block = sweep("block_size", blocks, n=256 if q else 8192)
    out_dir = tempfile.mkdtemp() if q else HERE  # smoke runs leave the committed figures alone
    for rows, name, label in (
        (by_n, "N", "initializations N"),
        (by_tokens, "tokens", "tokens T (dim 8)"),
        (by_dim, "dim", "dim (T = 8)"),
        (by_t1, "t1", "horizon t1"),
        (by_block, "block", "block size"),
    ):
        plot(rows, name, label, os.path.join(out_dir, f"scaling_{name}.png"), loglog=name != "t1")

    def rows_of(rows):
        return [[fmt(r[0]), fmt(r[1]), fmt(r[2]), fmt(r[3]), r[4], r[5]] for r in rows]

    head = ["value", "steady s", "compile s", "mean steps", "max steps", "all ok"]
    prec = []
    ref = run(n=small, repeats=1)[2]
    for p in ("float64", "float32"):
        first, best, tr = run(n=small, precision=p)
        err = float(np.max(np.abs(np.asarray(tr.weights[:, -1], float) - np.asarray(ref.weights[:, -1]))))
        errV = float(np.max(np.abs(np.asarray(tr.V[:, -1], float) - np.asarray(ref.V[:, -1]))))
        prec.append([p, fmt(best), fmt(small / best), fmt(err), fmt(errV), bool(np.all(tr.ok))])
    mem = []
    for kind in ("flow", "descend"):
        for n in [1024] if q else [1024, 16384, 131072]:
            r = memory(n, kind)
            mem.append(
                [kind, n, fmt(r["first"] - r["steady"]), fmt(r["steady"]), fmt(r["base"]), fmt(r["peak"])]
            )
    body = "\n\n".join(
        [
            f"N = {small}, T = dim = 8, t1 = 1e5, rtol 1e-6, atol 1e-8 unless varied; steady time "
            "is the best of 2 calls after the first (compile) call. Figures: `benchmarks/scaling_*.png`.",
            f"Against N (log-log slope {slope(by_n[1:]):.2f}; 1 = linear):\n\n"
            + table(["N"] + head[1:], rows_of(by_n)),
            f"Against tokens (slope {slope(by_tokens):.2f}):\n\n"
            + table(["tokens"] + head[1:], rows_of(by_tokens)),
            f"Against dim (slope {slope(by_dim):.2f}; the reduced (u, a) state does not grow with dim):\n\n"
            + table(["dim"] + head[1:], rows_of(by_dim)),
            "Against the horizon t1 (log-time integration: steps grow about like log t1):\n\n"
            + table(["t1"] + head[1:], rows_of(by_t1)),
            f"Against `block_size` (inits per vmapped block; N = {256 if q else 8192}):\n\n"
            + table(["block"] + head[1:], rows_of(by_block)),
            "float32 (`precision='float32'`) against float64, deviation of final weights / values from the "
            "float64 run at the same tolerances:\n\n"
            + table(["precision", "steady s", "inits/s", "max abs err s", "max abs err V", "all ok"], prec),
            "Compile and memory, each in a fresh process (flow to t1 = 1e5; descend 1000 steps; MiB):\n\n"
            + table(["entry point", "N", "compile s", "steady s", "RSS before (MiB)", "peak RSS (MiB)"], mem),
        ]
    )
    record("scaling", "(c, d) Scaling, block size, precision, compile time and memory", body, quick=q)


if __name__ == "__main__":
    main()
