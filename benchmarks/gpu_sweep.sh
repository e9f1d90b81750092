#!/usr/bin/env bash
# The main job on one GPU: `polarize sweep --inits 1000000` with every default (on a GPU
# that is blocks of 16,384, one per device at a time, in chunks of 131,072), first with an empty
# compilation cache, then cached; then the same sweep with other block sizes (each
# compiled, then cached), for the choice of the default. Prints each run's wall time and result line.
#
#   PYTHON=python3 bash benchmarks/gpu_sweep.sh        (from the repository root)
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export POLARIZE_CACHE_DIR="$(mktemp -d)"
PY=${PYTHON:-python}
N=${N:-1000000}
run() {  # label, extra args
    local label=$1; shift
    local out; out=$(mktemp -d)
    local start; start=$(date +%s.%N)
    # the whole output to a file, its first line printed after: a pipe into `head -1`
    # would close before the command's last line
    timeout "${LIMIT:-150}" "$PY" -m polarize.cli sweep --inits "$N" --out "$out" --overwrite --no-progress "$@" \
        >"$out.log" 2>&1
    head -1 "$out.log"
    echo "| $label | $* | $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s |"
    rm -rf "$out" "$out.log"
}
"$PY" -c "import jax; print('devices:', jax.devices())"
echo "| run | extra arguments | wall |"
run "defaults, empty compilation cache"
run "defaults, cached programs"
for b in 4096 65536; do  # each compiled once, then timed with its programs cached
    run "block $b, empty cache for its programs" --block-size "$b"
    run "block $b, cached programs" --block-size "$b"
done
