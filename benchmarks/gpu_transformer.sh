#!/usr/bin/env bash
# The transformer lab's core comparison on one GPU, at the paper's width and budget:
# softmax vs unnormalized sigmoid, heads 1/2/4/8, 5 seeds each, width 128, lr 1e-3,
# 10 epochs of 100k sequences (3,900 AdamW steps at batch 256), aux loss 0.2, query shift
# on, positions add (the paper's figure subset). Sized to finish in under 8 minutes:
# 8 variants, each one vmapped job of 5 seeds. It stops itself after 460 s; the result
# folder is resumable, so running the script again finishes what is left.
#
#   bash benchmarks/gpu_transformer.sh [OUT]          (from the repository root)
#
# Prints the per-variant wall/CPU times, the sink-head share per normalization with its
# bootstrap 90% interval, and writes OUT/induction/{summary.json,*.png,units/}.
# Needs only the repository and a CUDA jax: PYTHONPATH=. (no package install).
set -euo pipefail
OUT=${1:-${OUT:-gpu_transformer_out}}
PY=${PYTHON:-python}
export PYTHONPATH=.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$OUT"
"$PY" -c "import jax; print('devices:', jax.devices())"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
uptime
start=$(date +%s)
status=0
timeout "${LIMIT:-460}" "$PY" -m polarize.cli induction --preset paper --norms softmax,sigmoid --lr 1e-3 \
    --out "$OUT/induction" --overwrite 2>&1 | tee "$OUT/induction.log" || status=$?
echo "wall: $(( $(date +%s) - start )) s (exit status $status; 124 = stopped at 460 s, rerun to resume)"
uptime
