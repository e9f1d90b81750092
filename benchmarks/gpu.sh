#!/usr/bin/env bash
# GPU figures in one run (< 8 minutes on one accelerator): polarize `flow` on 1e6
# initializations for every path (paper toy / reduced, square / analytic, logistic data
# with sigmoid, cross-entropy / autodiff), float32 and float64, default 64 saves, plus
# `descend` on the toy. Prints a Markdown table and writes it to benchmarks/GPU.md.
#
#   bash benchmarks/gpu.sh            # needs jax with CUDA; N=1000000
#   N=20000 bash benchmarks/gpu.sh    # a smaller dry run (also works on CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
N="${N:-1000000}" BLOCK="${BLOCK:-65536}" timeout 470 python - <<'PY'
import os, time, platform
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import polarize as pz

n, block = int(os.environ["N"]), int(os.environ["BLOCK"])
cases = [
    ("paper toy, reduced (T = d = 8, t1 = 1e5)", dict(tokens=8, dim=8), pz.random_direction(1, 8), 1e5, "softmax"),
    ("square, conditioning (n = d = T = 16, t1 = 300)", dict(tokens=16, dim=16), pz.conditioned_regression(2, 16, 16, 3.0), 300.0, "softmax"),
    ("logistic data, sigmoid (d = T = 8, t1 = 1e3)", dict(tokens=8, dim=8), pz.random_labels(3, 16, 8), 1e3, "sigmoid"),
    ("cross-entropy, autodiff (d = 10, t1 = 1e3)", dict(tokens=8, dim=10), pz.peaked_distribution(4, 10), 1e3, "softmax"),
]
rows = []
for name, shape, objective, t1, norm in cases:
    for precision in ("float32", "float64"):
        model = pz.init_ensemble(0, n, v_scale=0.1, norm=norm, **shape)
        run = lambda: pz.flow(model, objective, t1=t1, precision=precision, block_size=block)
        start = time.perf_counter(); tr = jax.block_until_ready(run()); first = time.perf_counter() - start
        start = time.perf_counter(); tr = jax.block_until_ready(run()); steady = time.perf_counter() - start
        ok = float(np.mean(np.asarray(tr.ok)))
        rows.append(f"| {name} | {precision} | {n} | {first - steady:.2f} | {steady:.2f} | {n / steady:.3g} | {ok:.4f} |")
        print(rows[-1], flush=True)
model = pz.init_ensemble(0, n, tokens=8, dim=8, v_scale=0.1)
run = lambda: pz.descend(model, pz.random_direction(1, 8), 0.1, steps=10_000, save_at=[0, 10_000], block_size=block)
jax.block_until_ready(run()); start = time.perf_counter(); jax.block_until_ready(run()); steady = time.perf_counter() - start
rows.append(f"| descend, toy, lr 0.1 x 1e4 steps | float64 | {n} | - | {steady:.2f} | {n * 1e4 / steady:.3g} init-steps/s | - |")
print(rows[-1], flush=True)
dev = jax.devices()[0]
text = (
    f"# GPU figures\n\nCommand: `bash benchmarks/gpu.sh` (N = {n}, block_size = {block}); device: "
    f"{dev.device_kind} ({jax.default_backend()}), jax {jax.__version__}, {platform.node()}.\n\n"
    "| case | precision | N | compile s | steady s | inits/s | fraction ok |\n|---|---|---|---|---|---|---|\n"
    + "\n".join(rows) + "\n"
)
print(text)
with open("benchmarks/GPU.md", "w") as f:
    f.write(text)
PY
