"""The main job as users run it: `polarize sweep --inits 1000000` with every default.

Runs the CLI in pairs, each run in a fresh process (compilation, chunk files, summary
and figures included): first with an empty persistent compilation cache (a user's first
run), then again with the programs that run cached (every later run of the same
shapes); two pairs by default, each with a cache of its own, and the medians. Reports
each run's wall time, peak resident memory (VmHWM, read by the child itself at exit) and
throughput; then the same sweep's per-chunk cost split into its parts (the flow solve
alone, the flow with its hitting times, the final statistics; the previous restart method
of hitting times for comparison), measured in this process on one run of blocks (`sweep.AT_ONCE_CPU`
initializations).

    python benchmarks/sweep_million.py            # 1e6 inits, two pairs of runs (~4 minutes)
    python benchmarks/sweep_million.py --quick    # 2e4 inits, does not write RESULTS.md
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import fmt, record, table  # noqa: E402

# the `polarize` command (`polarize.cli:run`), its peak RSS printed by an exit handler (run
# calls them before it ends the process)
CHILD = """
import atexit, sys
def peak():
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(f"PEAK_RSS_KB {hwm}", file=sys.stderr)
atexit.register(peak)
sys.argv[0] = "polarize"
from polarize.cli import run
run()
"""


def run_cli(inits: int, cache: str) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, summary line) of `polarize sweep --inits N` with defaults,
    its persistent compilation cache in the folder `cache`."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, "sweep", "--inits", str(inits), "--out", out]
            + ["--overwrite", "--no-progress"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "POLARIZE_CACHE_DIR": cache, "POLARIZE_NO_CACHE": ""},
        )
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"polarize sweep failed:\n{proc.stderr[-3000:]}")
    peak = next(int(x.split()[1]) for x in proc.stderr.splitlines() if x.startswith("PEAK_RSS_KB"))
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    last = next((x for x in lines if "failed" in x), lines[-1])  # the summary line
    return wall, peak / 1024, last


def parts() -> list[list]:
    """Seconds of each part of one run of a chunk's blocks (`sweep.AT_ONCE_CPU` inits,
    defaults), steady state, on one thread (as each of a sweep's threads)."""
    os.environ["POLARIZE_THREADS"] = "1"
    import jax

    jax.config.update("jax_enable_x64", True)
    from polarize.measure._statistics import final_statistics
    from polarize.runs import _numerics, _sweep as sweep
    from polarize.runs._config import SweepConfig

    config = SweepConfig()
    objective = config.build_objective()
    model = config.build_model(0, sweep.AT_ONCE_CPU)

    def steady(fn, repeats=3):  # best of `repeats` after a warm-up call
        out = jax.block_until_ready(fn())
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out = jax.block_until_ready(fn())
            best = min(best, time.perf_counter() - start)
        return best, out

    import polarize as pz
    from polarize.solve._hitting import hitting_times

    options = dict(
        rtol=config.rtol, atol=config.atol, max_steps=config.max_steps, solver=config.build_solver()
    )
    alone, traj = steady(lambda: pz.flow(model, objective, t1=config.t1, n_save=config.n_save, **options))
    both, _ = steady(lambda: _numerics.solve_with_times(config, model, objective))
    stats, _ = steady(lambda: final_statistics(traj, objective, keep=config.snapshot_index()))
    restart, _ = steady(
        lambda: hitting_times(
            traj, model, objective, levels=config.levels, loss_fraction=config.loss_fraction, **options
        )
    )
    whole, _ = steady(lambda: _numerics.measure(config, model, objective))
    rows = [
        ["flow alone (64 saves), trajectories stored", alone],
        ["flow and its hitting times (4 targets) from one solve, trajectories stored", both],
        ["final statistics of stored trajectories", stats],
        ["what a sweep runs (`measure`): all three, each block reduced as soon as solved", whole],
        ["for comparison: hitting times by restarts over saved intervals (`hitting_times`)", restart],
    ]
    return [[name, fmt(s), fmt(1e6 * s / sweep.AT_ONCE_CPU), fmt(100 * s / whole)] for name, s in rows]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2e4 inits; does not write RESULTS.md")
    parser.add_argument(
        "--pairs",
        type=int,
        help="(first, cached) pairs, each with a fresh cache of its own (default 2; 1 with --quick)",
    )
    args = parser.parse_args(argv)
    inits = 20_000 if args.quick else 1_000_000
    pairs = args.pairs or (1 if args.quick else 2)
    from polarize.runs import _sweep as sweep

    first, cached = [], []
    for _ in range(pairs):  # this machine's run-to-run spread is ~10%: one pair is one sample
        with tempfile.TemporaryDirectory() as cache:
            first.append(run_cli(inits, cache))  # an empty cache, as on a user's first run
            cached.append(run_cli(inits, cache))  # the programs the first run cached
    rows = []
    for i in range(pairs):
        both = (("first (compiles)", first[i]), ("again (cached programs)", cached[i]))
        for label, (wall, peak, _) in both:
            rows.append([f"{label}, pair {i + 1}", inits, fmt(wall), fmt(inits / wall), fmt(peak)])
    median = lambda runs, k: statistics.median(r[k] for r in runs)
    for label, runs in (("first runs", first), ("cached runs", cached)):
        wall = median(runs, 0)
        rows.append([f"median of the {label}", inits, fmt(wall), fmt(inits / wall), fmt(median(runs, 1))])
    body = (
        f"`polarize sweep --inits {inits}` with every default (logistic toy T = d = 8, t1 = 1e5, "
        f"64 saves, hitting times, chunks of 12,288 written to disk), each run in a fresh process on "
        f"this machine ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end). "
        f"{pairs} pair(s) of runs, each pair with a compilation cache of its own: the first run "
        "starts from an empty cache; the second finds its programs in the persistent cache the "
        "first one filled (`polarize.solve._devices.cache_dir()`), as every later run of the same shapes "
        "does:\n\n"
        + table(["run", "inits", "wall s", "inits / s", "peak RSS MiB"], rows)
        + f"\n\nThe first run's summary line: `{first[0][2]}`\n\n"
        f"Where a run of {sweep.AT_ONCE_CPU} inits spends its time (this process, one thread, best of 3 "
        "after a warm-up, compile excluded):\n\n"
        + table(["part", "s", "us / init", "% of measure()"], parts())
    )
    record("sweep-million", "(f) The main job at 1e6 initializations", body, quick=args.quick)


if __name__ == "__main__":
    main()
