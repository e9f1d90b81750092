"""A notebook's first calls after its first flow: seconds and XLA compiles of each.

Each run is a fresh Python. It draws the toy (1000 inits, T = d = 8), runs its first
`pz.flow(model, objective, t1=1e5)`, then times the first call of each function below,
waited for with `jax.block_until_ready`, and counts the programs XLA compiled for it.
On a first call, every operation that runs outside `jit` compiles a small program of
its own (20-50 ms each on these machines).

With `--ref COMMIT` the same runs are made with the polarize of that commit (a
temporary git worktree, its processes started in it), alternating with this tree's, so the
two are measured in the same hour.

    python benchmarks/first_calls.py                  # writes section (i) of RESULTS.md
    python benchmarks/first_calls.py --ref 209d1ee    # against a commit, RESULTS.md too
    python benchmarks/first_calls.py --quick          # one run, RESULTS.md untouched
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import fmt, record, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the first calls, timed in this order after the toy's first flow
CALLS = {
    "pz.summarize(traj, objective)": "lambda: pz.summarize(traj, objective)",
    "pz.final_entropy(traj)": "lambda: pz.final_entropy(traj)",
    "pz.descend_with_hitting_times(model, objective, 0.5, steps=2000)": (
        "lambda: pz.descend_with_hitting_times(model, objective, 0.5, steps=2000)"
    ),
    "pz.random_labels(3, 64, 8)": "lambda: pz.random_labels(3, 64, 8)",
}
CHILD = """
import json, time
import jax, jax.monitoring
jax.config.update("jax_enable_x64", True)
import polarize as pz
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(1) if event.endswith("backend_compile_duration") else None
)
model = pz.init_ensemble(0, 1000, tokens=8, dim=8)
objective = pz.random_direction(1, 8)
traj = jax.block_until_ready(pz.flow(model, objective, t1=1e5))
out = {}
for name, call in CALLS.items():
    compiles.clear()
    start = time.perf_counter()
    jax.block_until_ready(eval(call)())
    out[name] = [time.perf_counter() - start, len(compiles)]
print("RESULT", json.dumps({"file": pz.__file__, "calls": out}))
"""


def run(tree: Path) -> dict:
    """{call: [seconds, compiles]} of one fresh process running the polarize of `tree`."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tree)}
    code = f"CALLS = {CALLS!r}\n{CHILD}"
    # in `tree`: `python -c` puts the working folder first on the path, before an
    # editable install's finder, so that a worktree's polarize is the one imported
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"a run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    if Path(result["file"]).resolve() != (tree / "polarize" / "__init__.py").resolve():
        raise SystemExit(f"a run of {tree} imported {result['file']}")
    return result["calls"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per tree (median)")
    parser.add_argument("--ref", help="a git commit to measure beside this tree")
    parser.add_argument("--quick", action="store_true", help="one run; RESULTS.md untouched")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be a positive number of runs; got {args.repeats}")
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        ref = None
        if args.ref:
            ref = Path(tmp) / "ref"
            git = ["git", "-C", str(ROOT), "worktree"]
            added = subprocess.run(
                [*git, "add", "-q", "--detach", str(ref), args.ref], capture_output=True, text=True
            )
            if added.returncode != 0:
                raise SystemExit(
                    f"--ref {args.ref!r}: not a commit of this repository ({added.stderr.strip()})"
                )
        try:
            runs = {"this tree": [], args.ref: []} if ref else {"this tree": []}
            for _ in range(repeats):  # alternating: a shared machine's speed drifts
                if ref:
                    runs[args.ref].append(run(ref))
                runs["this tree"].append(run(ROOT))
        finally:
            if ref:
                subprocess.run([*git, "remove", "--force", str(ref)], check=False)
    rows = []
    for name in CALLS:
        row, medians = [f"`{name}`"], {}
        for tree in runs:
            seconds = [r[name][0] for r in runs[tree]]
            medians[tree] = statistics.median(seconds)
            row.append(f"{fmt(medians[tree])} ({fmt(min(seconds))}-{fmt(max(seconds))})")
            row.append("/".join(str(c) for c in sorted({r[name][1] for r in runs[tree]})))
        if ref:
            row.append(fmt(medians[args.ref] / medians["this tree"], 2))
        rows.append(row)
    header = ["first call"]
    for tree in runs:
        header += [f"{tree}: s, median (range)", f"{tree}: XLA compiles"]
    if ref:
        header.append(f"{args.ref} / this tree")
    body = (
        f"Each a fresh process, {repeats} run(s) per tree"
        + (", alternating" if ref else "")
        + "; the toy's 1000 inits after their first `pz.flow(model, objective, t1=1e5)`.\n\n"
        + table(header, rows)
    )
    record("i-first-calls", "(i) A notebook's first calls after its first flow", body, quick=args.quick)


if __name__ == "__main__":
    main()
