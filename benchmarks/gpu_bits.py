"""On a GPU, do a sweep's numbers depend on how its programs were compiled? One call, ~6 min.

Run 4 (benchmarks/GPU.md) found a sweep's float64 measurements different with the CLI's
compile cache (then stored exported programs and XLA's persistent cache; now XLA's
persistent cache only) and without it (POLARIZE_NO_CACHE=1) on an H100, while on CPU
they are identical bit for bit. One of those sweeps (square to t1 = 1e4) ran the same
traced code either way, so the question is XLA's GPU compile. This runs the two sweeps that differed
(same_numbers.py's `default` and `square`) in seven rounds of processes and compares them:

- without the cache, twice: do two fresh compiles of one program give the same bits?
- with an empty cache: the cached compile against the first;
- both again with XLA_FLAGS=--xla_gpu_deterministic_ops=true, and with autotuning off
  (--xla_gpu_autotune_level=0): XLA's notes on determinism name autotuning, which picks
  kernels by timing them, as what makes two compiles of one program differ.

    python3 benchmarks/gpu_bits.py          # on the GPU machine, from the repository root
    python benchmarks/gpu_bits.py --cpu     # the first three on this machine (all identical)

Prints each comparison: "identical", or each array that differs with how many entries and
the largest relative difference.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from same_numbers import ROOT, compare, run_sweeps

NAMES = ("default", "square")
#: XLA_FLAGS tried besides the default: tag -> flags
FLAGS = {"det": "--xla_gpu_deterministic_ops=true", "noautotune": "--xla_gpu_autotune_level=0"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="skip the runs with GPU-only XLA flags")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="gpu-bits-"))

    def run(tag: str, **environ: str) -> None:
        start = time.perf_counter()
        print(f"{tag}:", flush=True)
        run_sweeps(ROOT, base / tag, NAMES, **environ)
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)

    def check(a: str, b: str, what: str) -> None:
        differ = compare(base / a, base / b, NAMES)
        found = "identical" if not differ else "\n  " + "\n  ".join(differ)
        print(f"{what} ({a} vs {b}): {found}", flush=True)

    def cache() -> dict:  # the CLI's cache on, in a new folder
        return {"POLARIZE_CACHE_DIR": tempfile.mkdtemp(prefix="gpu-bits-cache-"), "POLARIZE_NO_CACHE": ""}

    run("fresh1", POLARIZE_NO_CACHE="1")
    run("fresh2", POLARIZE_NO_CACHE="1")
    run("cached", **cache())
    check("fresh1", "fresh2", "two fresh compiles")
    check("fresh1", "cached", "no cache against the cache")
    for tag, flags in {} if args.cpu else FLAGS.items():
        run(f"{tag}_fresh", POLARIZE_NO_CACHE="1", XLA_FLAGS=flags)
        run(f"{tag}_cached", XLA_FLAGS=flags, **cache())
        check(f"{tag}_fresh", f"{tag}_cached", f"{flags}: no cache against the cache")
        check("fresh1", f"{tag}_fresh", f"default flags against {flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
