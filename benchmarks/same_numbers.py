"""Are a sweep's stored numbers the same as at another commit? Bit for bit, on this machine.

Runs five sweeps (the default logistic flow, square with the stiff default and at a
horizon where the default is Tsit5, gradient descent, cross-entropy) with the polarize
of this tree and with the polarize of a git ref (checked out in a temporary worktree,
run in its own Python process), then
compares every array of per_init.npz and series.npz exactly (NaN equal to NaN).

    python benchmarks/same_numbers.py --ref 318597f        # this tree against a commit
    python benchmarks/same_numbers.py --out DIR            # only run this tree's sweeps
    python benchmarks/same_numbers.py --compare DIR1 DIR2  # two earlier --out folders

Exit status 0 when every array is identical, 1 otherwise. Numbers are compared on one
machine only: XLA's CPU code differs between processors, so two machines may differ in
the last bits, and that is not what this checks.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: name -> `polarize sweep` arguments; small enough to run in about a minute together.
SWEEPS = {
    "default": ["--inits", "300"],
    "square": ["--objective", "square", "--tokens", "10", "--dim", "10", "--inits", "200", "--t1", "1e4"],
    # a horizon short enough for Tsit5: the default is decided on the concrete objective
    "square-short": [
        "--objective",
        "square",
        "--tokens",
        "10",
        "--dim",
        "10",
        "--inits",
        "200",
        "--t1",
        "300",
    ],
    "gd": ["--method", "gd", "--inits", "200", "--steps", "2000", "--lr", "0.5"],
    "cross-entropy": ["--objective", "cross-entropy", "--tokens", "6", "--dim", "6", "--inits", "128"]
    + ["--t1", "1e3"],
}
FILES = ("per_init.npz", "series.npz")
_MAIN = "import sys; from polarize.cli import main; sys.exit(main(sys.argv[1:]))"


def run_sweeps(tree: Path, out: Path, names=tuple(SWEEPS), **environ: str) -> None:
    """The sweeps `names` of `SWEEPS` with the polarize package found in `tree`, into
    out/<name>, with the variables `environ` set besides this process's own."""
    env = {**os.environ, "PYTHONPATH": str(tree), "JAX_ENABLE_X64": "1", **environ}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    for name in names:
        args = SWEEPS[name]
        cmd = [sys.executable, "-c", _MAIN, "sweep", *args, "--out", str(out / name), "--no-progress"]
        done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: too many failed inits, still written
            sys.exit(f"{name} sweep failed in {tree}:\n{done.stderr[-2000:]}")
        print(f"  {name}: {done.stdout.strip().splitlines()[0]}")


def compare(a: Path, b: Path, names=tuple(SWEEPS)) -> list[str]:
    """The arrays that differ between two folders of `run_sweeps` (a: this tree, b: the
    reference), as lines that say by how much. An array only `a` has is new, printed and
    not a difference; one only `b` has is lost, a difference."""
    bad = []
    for name in names:
        for file in FILES:
            with np.load(a / name / file) as x, np.load(b / name / file) as y:
                new, lost = sorted(set(x.files) - set(y.files)), sorted(set(y.files) - set(x.files))
                if new:
                    print(f"{name}/{file}: new array(s) {new}")
                if lost:
                    bad.append(f"{name}/{file}: array(s) {lost} no longer stored")
                for key in sorted(set(x.files) & set(y.files)):
                    if not np.array_equal(x[key], y[key], equal_nan=x[key].dtype.kind == "f"):
                        bad.append(f"{name}/{file}:{key} differs: {_how_much(x[key], y[key])}")
    return bad


def _how_much(x: np.ndarray, y: np.ndarray) -> str:
    """How many entries of two arrays of one shape differ, and (floats) the largest
    relative difference among the finite ones."""
    if x.shape != y.shape:
        return f"shapes {x.shape} and {y.shape}"
    same = x == y
    if x.dtype.kind == "f":
        same |= np.isnan(x) & np.isnan(y)
    text = f"{np.sum(~same)} of {x.size} entries"
    if x.dtype.kind == "f":
        with np.errstate(all="ignore"):
            rel = (np.abs(x - y) / np.maximum(np.abs(x), np.abs(y)))[~same]
        rel = rel[np.isfinite(rel)]
        text += f", largest relative difference {rel.max():.1e}" if rel.size else ", none finite in both"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="git ref to compare this tree against")
    parser.add_argument("--out", type=Path, help="folder for this tree's sweeps")
    parser.add_argument("--compare", nargs=2, type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if args.compare:
        first, second = args.compare
    else:
        first = args.out or Path(tempfile.mkdtemp(prefix="same-numbers-"))
        print(f"this tree -> {first}")
        run_sweeps(ROOT, first)
        if not args.ref:
            return 0
        second = Path(tempfile.mkdtemp(prefix="same-numbers-ref-"))
        worktree = second / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.ref], check=True
        )
        try:
            print(f"{args.ref} -> {second}")
            run_sweeps(worktree, second)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=True
            )
    bad = compare(first, second)
    n = sum(len(np.load(first / s / f).files) for s in SWEEPS for f in FILES)
    print("\n".join(bad) if bad else f"identical: {n} arrays in {len(SWEEPS)} sweeps, bit for bit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
