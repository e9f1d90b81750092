#!/usr/bin/env bash
# GPU figures in one run (< 8 minutes on one accelerator): polarize `flow` on 1e6
# initializations for every path (paper toy / reduced, square / analytic, logistic data
# with sigmoid, cross-entropy / autodiff), float32 and float64, ends only and the default
# 64 saves (on SAVED_N = 65536 inits for the full-state objectives, whose 64-save output
# at 1e6 inits does not fit in GPU memory in float64), plus `descend` on the toy.
# Prints a Markdown table and rewrites benchmarks/GPU.md after every row.
#
#   bash benchmarks/gpu.sh            # needs jax with CUDA; N=1000000
#   N=20000 bash benchmarks/gpu.sh    # a smaller dry run (also works on CPU)
#   LIMIT=300 PYTHON=python3 bash benchmarks/gpu.sh   # stop after 300 s; rows so far stay in GPU.md
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
N="${N:-1000000}" BLOCK="${BLOCK:-65536}" timeout "${LIMIT:-470}" "${PYTHON:-python}" - <<'PY'
import os, time, platform
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import polarize as pz

n, block = int(os.environ["N"]), int(os.environ["BLOCK"])
cases = [
    ("paper toy, reduced (T = d = 8, t1 = 1e5)", dict(tokens=8, dim=8), pz.random_direction(1, 8), 1e5, "softmax"),
    ("logistic data, sigmoid (d = T = 8, t1 = 1e3)", dict(tokens=8, dim=8), pz.random_labels(3, 16, 8), 1e3, "sigmoid"),
    ("cross-entropy, autodiff (d = 10, t1 = 1e3)", dict(tokens=8, dim=10), pz.peaked_distribution(4, 10), 1e3, "softmax"),
    # the slowest case (many steps per init) goes last, so a stopped run still has the others
    ("square, conditioning (n = d = T = 16, t1 = 300)", dict(tokens=16, dim=16), pz.conditioned_regression(2, 16, 16, 3.0), 300.0, "softmax"),
]
dev = jax.devices()[0]
header = (
    f"# GPU figures\n\nCommand: `bash benchmarks/gpu.sh` (N = {n}, block_size = {block}); device: "
    f"{dev.device_kind} ({jax.default_backend()}), jax {jax.__version__}, {platform.node()}.\n\n"
    "| case | precision | N | compile s | steady s | inits/s | fraction ok |\n|---|---|---|---|---|---|---|\n"
)
rows = []


def record(row):
    """Print one row and rewrite GPU.md with every row so far (a stopped run keeps them)."""
    rows.append(row)
    print(row, flush=True)
    with open("benchmarks/GPU.md", "w") as f:
        f.write(header + "\n".join(rows) + "\n")


def timed(run):
    start = time.perf_counter(); jax.block_until_ready(run()); first = time.perf_counter() - start
    start = time.perf_counter(); result = jax.block_until_ready(run()); steady = time.perf_counter() - start
    return result, first, steady


def flow_rows(name, shape, objective, t1, norm, saves, size):
    for precision in ("float32", "float64"):
        model = pz.init_ensemble(0, size, v_scale=0.1, norm=norm, **shape)
        run = lambda: pz.flow(model, objective, t1=t1, precision=precision, block_size=min(block, size), n_save=saves)
        label = f"{name}, {'ends only' if saves == 2 else f'{saves} saves'}"
        try:
            tr, first, steady = timed(run)
        except Exception as error:  # out of device memory, say: a row that says so
            record(f"| {label} | {precision} | {size} | - | - | failed: {str(error).splitlines()[0][:80]} | - |")
            continue
        ok = float(np.mean(np.asarray(tr.ok)))
        record(f"| {label} | {precision} | {size} | {first - steady:.2f} | {steady:.2f} | {size / steady:.3g} | {ok:.4f} |")


# The paper toy saves its reduced state; the full-state objectives save (inits, 64, state)
# arrays (1e6 x 64 x 272 float64 for the square case: 139 GB), so their 64-save rows run
# on SAVED_N initializations (one block) and their 1e6 rows save the ends only.
saved_n = int(os.environ.get("SAVED_N", 65536))
flow_rows(*cases[0], 64, n)
flow_rows(*cases[0], 2, n)
model = pz.init_ensemble(0, n, tokens=8, dim=8, v_scale=0.1)
_, first, steady = timed(
    lambda: pz.descend(model, pz.random_direction(1, 8), 0.1, steps=10_000, save_at=[0, 10_000], block_size=block)
)
record(f"| descend, toy, lr 0.1 x 1e4 steps | float64 | {n} | {first - steady:.2f} | {steady:.2f} | {n * 1e4 / steady:.3g} init-steps/s | - |")
for case in cases[1:]:
    flow_rows(*case, 2, n)
    flow_rows(*case, 64, saved_n)
print(header + "\n".join(rows))
PY
