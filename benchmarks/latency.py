"""Time to result: what a user waits for, as a ratio to FLOOR, all measured in this run.

FLOOR is a fresh Python that imports jax and runs one jitted op, the median of runs at
the start and at the end (a shared machine's speed drifts). Every other row is a
fresh process too (its imports, tracing, compiling, figures and files included), each
the median of `--repeats` runs:

- `polarize --help`, and two bad inputs (a sweep setting, a study file);
- the default sweep (`polarize sweep`, 1000 inits): on an empty compilation cache, then
  warm (the cache the cold run filled);
- an 8-cell study (square loss, T = d = 20, t1 = 300, 200 inits a cell, kappa x seed),
  warm;
- a notebook's first `pz.flow(model, objective)` on the toy (1000 inits, t1 = 1e5), from
  the process start on a cold cache, and a second call with new data of the same shapes
  (in the same process).

    python benchmarks/latency.py            # writes section (g) of RESULTS.md
    python benchmarks/latency.py --quick    # one run each, RESULTS.md untouched
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import fmt, record, table  # noqa: E402

CLI = "import sys; sys.argv[0] = 'polarize'; from polarize.cli import run; run()"  # the `polarize` command
FLOOR = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
# a part of FLOOR that no code of ours touches: jax's own import of ml_dtypes
ML_DTYPES = (
    "import time; t = time.perf_counter(); import ml_dtypes; "
    "print(ml_dtypes.__version__, time.perf_counter() - t)"
)
NOTEBOOK = """
import sys, time
import jax
jax.config.update("jax_enable_x64", True)
import polarize as pz
model = pz.init_ensemble(0, 1000, tokens=8, dim=8)
objective = pz.random_direction(1, 8)
jax.block_until_ready(pz.flow(model, objective, t1=1e5))
first = time.perf_counter()
again = pz.init_ensemble(2, 1000, tokens=8, dim=8)
jax.block_until_ready(pz.flow(again, pz.random_direction(3, 8), t1=1e5))
print("SECOND", time.perf_counter() - first)
"""
STUDY = """name = "latency"
[base]
objective = "square"
tokens = 20
dim = 20
samples = 20
v_scale = 1e-5
a_scale = 1e-3
t1 = 300.0
inits = 200
[grid]
kappa = [1.0, 2.0, 5.0, 10.0]
seed = [0, 1]
[plot]
x = "kappa"
y = ["time_to_0.9", "max_weight"]
"""
#: targets, as multiples of FLOOR (issue 27)
TARGETS = {
    "help": 0.5,
    "bad sweep setting": 0.5,
    "bad study file": 0.5,
    "default sweep, empty cache": 5.0,
    "default sweep, warm": 2.0,
    "8-cell study, warm": 4.0,
    "notebook's first flow": 3.0,
}


def run(args: list[str], env: dict, expect: int = 0) -> tuple[float, str]:
    """(wall seconds, stdout) of `python args` in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != expect:
        raise SystemExit(f"{args[:4]} exited {proc.returncode}, not {expect}:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def median(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    parser.add_argument("--quick", action="store_true", help="one run each; RESULTS.md untouched")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "POLARIZE_NO_CACHE": ""}
    rows, seconds = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bad = tmp / "bad.toml"
        bad.write_text('[grid]\nkappa = [1.0]\n[plot]\ny = "no_such_statistic"\n')
        study = tmp / "study.toml"
        study.write_text(STUDY)
        floors = [run(["-c", FLOOR], base)[0] for _ in range(repeats)]
        seconds["help"] = median(lambda: run(["-c", CLI, "--help"], base)[0], repeats)
        seconds["bad sweep setting"] = median(
            lambda: run(["-c", CLI, "sweep", "--norm", "nope"], base, expect=2)[0], repeats
        )
        seconds["bad study file"] = median(
            lambda: run(["-c", CLI, "study", str(bad)], base, expect=2)[0], repeats
        )

        def sweep(cache: Path) -> float:
            with tempfile.TemporaryDirectory(dir=tmp) as out:
                env = {**base, "POLARIZE_CACHE_DIR": str(cache)}
                return run(["-c", CLI, "sweep", "--out", out, "--overwrite", "--no-progress"], env)[0]

        cold, warm = [], []
        for i in range(repeats):
            cache = tmp / f"cache-{i}"  # empty: the run fills it
            cold.append(sweep(cache))
            warm.append(sweep(cache))
        seconds["default sweep, empty cache"] = statistics.median(cold)
        seconds["default sweep, warm"] = statistics.median(warm)

        def study_run(cache: Path) -> float:
            with tempfile.TemporaryDirectory(dir=tmp) as out:
                env = {**base, "POLARIZE_CACHE_DIR": str(cache)}
                return run(["-c", CLI, "study", str(study), "--out", out, "--no-progress"], env)[0]

        cache = tmp / "cache-study"
        study_cold = study_run(cache)
        seconds["8-cell study, warm"] = median(lambda: study_run(cache), repeats)

        second = []

        def notebook() -> float:
            wall, out = run(["-c", NOTEBOOK], base)
            second.append(float(out.split("SECOND")[1]))
            return wall - second[-1]  # from the start to the first flow's result

        seconds["notebook's first flow"] = median(notebook, repeats)
        # FLOOR again at the end: a shared machine's speed drifts over the run's minute
        floors += [run(["-c", FLOOR], base)[0] for _ in range(repeats)]
        ml_dtypes = [run(["-c", ML_DTYPES], base)[1].split() for _ in range(repeats)]
    seconds = {"FLOOR": statistics.median(floors), **seconds}
    floor = seconds["FLOOR"]
    for name, s in seconds.items():
        target = TARGETS.get(name)
        met = "" if target is None else ("yes" if s / floor <= target else "no")
        rows.append([name, fmt(s), fmt(s / floor, 2), "" if target is None else f"<= {target:g}", met])
    rows.append(
        ["8-cell study, empty cache (for reference)", fmt(study_cold), fmt(study_cold / floor, 2), "", ""]
    )
    rows.append(
        [
            "notebook's second flow, new data (s, not x FLOOR)",
            fmt(statistics.median(second)),
            "",
            "<= 0.1 s",
            "yes" if statistics.median(second) <= 0.1 else "no",
        ]
    )
    body = (
        f"Each row a fresh process, median of {repeats} run(s); FLOOR = a fresh Python importing jax "
        f"and running one jitted op ({fmt(floor)} s here: the median of {len(floors)} runs, half at "
        f"the start and half at the end, {fmt(min(floors))}-{fmt(max(floors))} s). Of FLOOR, "
        f"jax's import of ml_dtypes {ml_dtypes[0][0]} takes "
        f"{fmt(statistics.median(float(t) for _, t in ml_dtypes))} s on its own (for other "
        "versions see benchmarks/NOTES.md), and every ratio here moves with it.\n\n"
        + table(["what the user runs", "wall s", "x FLOOR", "target", "met"], rows)
    )
    record("g-latency", "(g) Time to result, as multiples of FLOOR", body, quick=args.quick)


if __name__ == "__main__":
    main()
