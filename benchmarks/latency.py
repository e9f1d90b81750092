"""Time to result: what a user waits for, as a ratio to FLOOR, all measured in this run.

FLOOR is a fresh Python that imports jax and runs one jitted op. Every other row is a
fresh process too (its imports, tracing, compiling, figures and files included), run
`--repeats` times, each run just after a run of FLOOR: its ratio is the median of the
runs' ratios to the FLOOR before them, since a shared machine's speed drifts within the
script's minute (FLOOR 1.24-1.64 s in one run), and a ratio of two medians taken a minute
apart moved with the drift:

- `polarize --help`, and two bad inputs (a sweep setting, a study file);
- the default sweep (`polarize sweep`, 1000 inits): on an empty compilation cache, then
  warm (the cache the cold run filled);
- an 8-cell study (square loss, T = d = 20, t1 = 300, 200 inits a cell, kappa x seed),
  warm;
- a notebook's first `pz.flow(model, objective)` on the toy (1000 inits, t1 = 1e5) on a
  cold cache: the process's wall less its second call, so that, like FLOOR, it counts the
  process's start and exit; and that second call, with new data of the same shapes;
- for reference, that notebook's first flow where it keeps its programs
  (`pz.enable_compilation_cache(folder)`) and an earlier process filled the folder.

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
# the same notebook, keeping what it compiles in the folder named by its first argument
NOTEBOOK_CACHED = NOTEBOOK.replace(
    "import polarize as pz\n", "import polarize as pz\npz.enable_compilation_cache(sys.argv[1])\n"
)
assert NOTEBOOK_CACHED != NOTEBOOK, "the notebook no longer imports polarize as the cached row expects"
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
KEPT = "notebook's first flow, programs kept by an earlier process (for reference)"
#: targets, as multiples of FLOOR (issue 73: help and bad input answer before JAX starts,
#: a warm default sweep within 3x); the other rows are measured without a target
TARGETS = {
    "help": 0.5,
    "bad sweep setting": 0.5,
    "bad study file": 0.5,
    "default sweep, empty cache": None,
    "default sweep, warm": 3.0,
    "8-cell study, warm": None,
    "notebook's first flow": None,
}


def run(args: list[str], env: dict, expect: int = 0) -> tuple[float, str]:
    """(wall seconds, stdout) of `python args` in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != expect:
        raise SystemExit(f"{args[:4]} exited {proc.returncode}, not {expect}:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


class Paired:
    """Each row's runs, each with the run of FLOOR just before it."""

    def __init__(self, env: dict):
        self.env, self.walls, self.floors = env, {}, []

    def floor(self) -> float:
        wall = run(["-c", FLOOR], self.env)[0]
        self.floors.append(wall)
        return wall

    def time(self, name: str, fn) -> float:
        """Run `fn` (its wall seconds) after a run of FLOOR; record the pair under `name`."""
        floor = self.floor()
        wall = fn()
        self.walls.setdefault(name, []).append((wall, floor))
        return wall

    def repeat(self, name: str, fn, repeats: int) -> None:
        for _ in range(repeats):
            self.time(name, fn)

    def wall(self, name: str) -> float:
        return statistics.median(w for w, _ in self.walls[name])

    def ratio(self, name: str) -> float:
        return statistics.median(w / f for w, f in self.walls[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    parser.add_argument("--quick", action="store_true", help="one run each; RESULTS.md untouched")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be a positive number of runs; got {args.repeats}")
    repeats = 1 if args.quick else args.repeats
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "POLARIZE_NO_CACHE": ""}
    rows, timed = [], Paired(base)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bad = tmp / "bad.toml"
        bad.write_text('[grid]\nkappa = [1.0]\n[plot]\ny = "no_such_statistic"\n')
        study = tmp / "study.toml"
        study.write_text(STUDY)

        def cli(*args: str, expect: int = 0):
            return lambda: run(["-c", CLI, *args], base, expect=expect)[0]

        timed.repeat("help", cli("--help"), repeats)
        timed.repeat("bad sweep setting", cli("sweep", "--norm", "nope", expect=2), repeats)
        timed.repeat("bad study file", cli("study", str(bad), expect=2), repeats)

        def sweep(cache: Path) -> float:
            with tempfile.TemporaryDirectory(dir=tmp) as out:
                env = {**base, "POLARIZE_CACHE_DIR": str(cache)}
                return run(["-c", CLI, "sweep", "--out", out, "--overwrite", "--no-progress"], env)[0]

        for i in range(repeats):
            cache = tmp / f"cache-{i}"  # empty: the run fills it
            timed.time("default sweep, empty cache", lambda: sweep(cache))
            timed.time("default sweep, warm", lambda: sweep(cache))

        def study_run(cache: Path) -> float:
            with tempfile.TemporaryDirectory(dir=tmp) as out:
                env = {**base, "POLARIZE_CACHE_DIR": str(cache)}
                return run(["-c", CLI, "study", str(study), "--out", out, "--no-progress"], env)[0]

        cache = tmp / "cache-study"
        timed.time("8-cell study, empty cache (for reference)", lambda: study_run(cache))
        timed.repeat("8-cell study, warm", lambda: study_run(cache), repeats)

        second = []

        def notebook(*cached: str) -> float:
            # the start, the first flow and the exit, as FLOOR's wall counts its start and exit
            # (timed to their results instead, FLOOR and this row are each about 0.1 and 0.2 s
            # shorter: benchmarks/NOTES.md)
            wall, out = run(["-c", NOTEBOOK_CACHED, *cached] if cached else ["-c", NOTEBOOK], base)
            if not cached:
                second.append(float(out.split("SECOND")[1]))
            return wall - float(out.split("SECOND")[1])

        timed.repeat("notebook's first flow", notebook, repeats)
        for i in range(repeats):
            kept = str(tmp / f"notebook-{i}")
            notebook(kept)  # an earlier process fills the folder
            timed.time(KEPT, lambda: notebook(kept))
        ml_dtypes = [run(["-c", ML_DTYPES], base)[1].split() for _ in range(repeats)]
    floors = timed.floors
    rows.append(["FLOOR", fmt(statistics.median(floors)), "1", "", ""])
    order = [*list(TARGETS), "8-cell study, empty cache (for reference)", KEPT]
    for name in order:
        target, ratio = TARGETS.get(name), timed.ratio(name)
        met = "" if target is None else ("yes" if ratio <= target else "no")
        limit = "" if target is None else f"<= {target:g}"
        rows.append([name, fmt(timed.wall(name)), f"{ratio:.2f}", limit, met])
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
        f"Each row a fresh process, {repeats} run(s), each just after a run of FLOOR = a fresh Python "
        "importing jax and running one jitted op; wall s is the median of a row's runs, x FLOOR the "
        "median of their ratios to the FLOOR before each (FLOOR "
        f"{fmt(statistics.median(floors))} s here, the median of its {len(floors)} runs, "
        f"{fmt(min(floors))}-{fmt(max(floors))} s). Of FLOOR, "
        f"jax's import of ml_dtypes {ml_dtypes[0][0]} takes "
        f"{fmt(statistics.median(float(t) for _, t in ml_dtypes))} s on its own (for other "
        "versions see benchmarks/NOTES.md), and every ratio here moves with it.\n\n"
        + table(["what the user runs", "wall s", "x FLOOR", "target", "met"], rows)
    )
    record("g-latency", "(g) Time to result, as multiples of FLOOR", body, quick=args.quick)


if __name__ == "__main__":
    main()
