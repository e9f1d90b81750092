"""The `polarize` command: a thin layer that parses, validates and calls the public API.

Bad input ends with one line `polarize: error: ...` and exit status 2, no traceback.
Output into a pipe whose reader has gone (`polarize sweep | head -1`) ends the command
quietly with exit status 141, as a shell reports a writer a closed pipe stopped.

Each command runs in two steps: `args.func(args)` parses and validates every argument
without JAX (the config, the study file, the folder to resume) and returns the job;
then JAX starts (`_start_jax`) and the job runs. The modules that compute are imported
in the job: `polarize --help` and a bad argument answer before JAX is loaded.
"""

import argparse
import dataclasses
import gc
import os
import sys
import time
from pathlib import Path

from .core._choices import NORMALIZATION_NAMES
from .core._errors import PolarizeError
from .runs._config import METHODS, MODELS, OBJECTIVES, PROMPT_OBJECTIVES, SOLVERS, TRAIN, SweepConfig
from .runs._folder import check_out, check_study_out, require_kind, stored_config
from .runs._study_file import load_study
from .transformer.cli import add_subcommands


def _add_sweep(sub) -> None:
    d = SweepConfig()
    p = sub.add_parser(
        "sweep",
        help="Monte-Carlo study of polarization over many initializations",
        description="Run many initializations of the value-softmax model (or of prompt "
        "attention, --model prompt) under one setting "
        "and write config.json, summary.json, per-initialization arrays and figures. "
        "Defaults are the paper's logistic toy (softmax, T = d = 8, exact flow to t = 1e5). "
        "Finished chunks are saved as they complete; --resume DIR continues an interrupted run.",
    )

    def add(flag, kind=None, help="", **kw):
        name = flag.lstrip("-").replace("-", "_")
        default = getattr(d, name)
        if isinstance(default, tuple):
            default = " ".join(f"{x:g}" for x in default)
        if name in ("chunk_size", "block_size"):
            default = "by backend"
        # default None: lets --resume tell settings given on the command line from defaults
        p.add_argument(flag, type=kind, default=None, help=f"{help} (default {default})".strip(), **kw)

    add(
        "--model",
        str,
        f"one of {', '.join(MODELS)}: beta = V sigma(a), or prompt attention "
        "f_i = v^T X_i^T sigma(X_i p) on random tokens (its max weight: the least polarized sample's)",
    )
    add("--objective", str, f"one of {', '.join(OBJECTIVES)} (model prompt: {', '.join(PROMPT_OBJECTIVES)})")
    add("--norm", str, f"one of {', '.join(NORMALIZATION_NAMES)}")
    add("--temperature", float, "softmax temperature")
    add("--sink", float, "softmax1 sink logit c")
    add("--tokens", int, "T, number of tokens")
    add("--dim", int, "d, value dimension")
    add("--samples", int, "data points for logistic-data/square (None: 4d resp. d; model prompt: 4)")
    add("--kappa", float, "condition number of X (square loss)")
    add("--inits", int, "number of initializations")
    add("--method", str, f"one of {', '.join(METHODS)}: exact flow or gradient descent")
    add("--t1", float, "flow horizon")
    add("--rtol", float, "flow relative tolerance")
    add("--atol", float, "flow absolute tolerance")
    add("--solver", str, f"one of {', '.join(SOLVERS)}")
    add("--max-steps", int, "flow: solver steps per initialization before it counts as failed")
    add("--lr", float, "GD learning rate")
    add("--steps", int, "GD steps")
    add("--v-scale", float, "V(0) ~ v_scale N(0,1); model prompt with --train vp: v(0)")
    add("--a-scale", float, "a(0) ~ a_offset + a_scale N(0,1)")
    add("--a-offset", float, "a(0) offset")
    add(
        "--train",
        str,
        f"model prompt: one of {', '.join(TRAIN)}: p only (v fixed at the task's v ~ N(0, I)) or v and p",
    )
    add("--p-scale", float, "model prompt: p(0) ~ p_scale N(0, I)")
    add("--seed", int, "the i-th initialization derives from (seed, i)")
    add("--n-save", int, "saved times per trajectory (log-spaced)")
    add("--snapshots", int, "saved times kept per initialization for figures (at most --n-save)")
    add("--threshold", float, "one-hot threshold on max weight")
    add("--levels", float, "max-weight levels in (0, 1] whose hitting times are measured", nargs="+")
    add("--loss-fraction", float, "hitting time of the loss falling to this fraction of L(0)")
    add("--chunk-size", int, "initializations per chunk written to disk: 12288 on CPU, 131072 on GPU/TPU")
    add(
        "--block-size",
        int,
        "initializations per vmapped block, part of the results' bit-identity: 128 on CPU, 16384 on GPU/TPU",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/sweep-<time>)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--resume", type=Path, default=None, metavar="DIR", help="continue the run in DIR")
    p.add_argument(
        "--sample", type=int, default=0, help="keep full trajectories of the first N inits (at most --inits)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--force", action="store_true", help="run even where the memory estimate exceeds the memory available"
    )
    _add_distributed(p)
    p.set_defaults(func=_sweep)


def _add_distributed(p) -> None:
    p.add_argument(
        "--distributed",
        action="store_true",
        help="one of several processes sharing the run: calls jax.distributed.initialize() "
        "(under SLURM or Open MPI, or with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)",
    )


def _sweep(args):
    names = {f.name for f in dataclasses.fields(SweepConfig)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if args.resume is not None:
        if args.out is not None and Path(args.out) != Path(args.resume):
            raise PolarizeError("give either `--out` or `--resume`, not both with different folders")
        if args.overwrite:
            raise PolarizeError("`--overwrite` does not apply with `--resume`, which keeps the run's chunks")
        out = args.resume
        config = dataclasses.replace(stored_config(out), **given)
    else:
        out = args.out or Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
        config = SweepConfig(**given)
        check_out(out, args.overwrite)
    ignored = config.not_applicable(given)
    if ignored:
        flags = ", ".join(f"--{name.replace('_', '-')} ({why})" for name, why in ignored)
        raise PolarizeError(f"option(s) that do not apply to this sweep: {flags}; leave them out")
    return lambda: _run_sweep(args, config, out)


def _run_sweep(args, config: SweepConfig, out: Path) -> int:
    from .runs import run_sweep
    from .runs._results import failed_too_many, failure_line, result_line

    summary = run_sweep(
        config,
        out,
        overwrite=args.overwrite,
        resume=args.resume is not None,
        progress=not args.no_progress,
        sample=args.sample,
        force=args.force,
    )
    if not summary:  # a process other than 0: process 0 reports
        return 0
    print(result_line(config, summary))
    recomputed = summary.get("recomputed_chunks") or {}
    if recomputed:
        shown = ", ".join(f"{name} ({why})" for name, why in recomputed.items())
        print(f"recomputed {len(recomputed)} damaged chunk(s): {shown}")
    failures = failure_line(summary)
    if failures:
        print(failures)
    print(f"results: {out}")
    return 1 if failed_too_many(summary) else 0


def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="redraw every figure of a sweep or study folder from stored results",
        description="Regenerate figures from a finished sweep or study folder without recomputing.",
    )
    p.add_argument("dir", type=Path, help="a sweep or study folder")
    p.set_defaults(func=_report)


def _report(args):
    require_kind(args.dir)
    return lambda: _run_report(args.dir)


def _run_report(folder: Path) -> int:
    from .runs import report

    for path in report(folder):
        print(path)
    return 0


def _add_study(sub) -> None:
    p = sub.add_parser(
        "study",
        help="run a grid of sweeps from a TOML file, with a table and a comparison figure",
        description="Run every cell of the grid in FILE.toml as a resumable sweep, then write "
        "study.csv and a comparison figure. Rerunning continues where it stopped.",
    )
    p.add_argument("file", type=Path, help="study file (TOML), see examples/*.toml")
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/<study name>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--cell-figures",
        action="store_true",
        help="also draw each cell's four sweep figures (default: only the comparison; "
        "`polarize report OUT` draws them later)",
    )
    _add_distributed(p)
    p.set_defaults(func=_study)


def _study(args):
    study = load_study(args.file)
    out = args.out or Path("runs") / study.name
    check_study_out(out)
    return lambda: _run_study(args, study, out)


def _run_study(args, study, out: Path) -> int:
    import jax

    from .runs import run_study

    result = run_study(study, out, progress=not args.no_progress, cell_figures=args.cell_figures)
    if jax.process_index() != 0:
        return 0
    print(f"{result['cells']} cells; table: {out / 'study.csv'}; figure: {out / 'comparison.png'}")
    failed = result["failed_cells"]
    if failed:
        print(
            f"{len(failed)} of {result['cells']} cells failed: "
            + "; ".join(f"{k}: {v}" for k, v in failed.items())
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polarize",
        description="Training dynamics of softmax attention: gradient flow, polarization, sinks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sweep(sub)
    _add_study(sub)
    _add_report(sub)
    add_subcommands(sub)
    return parser


def _start_jax(args) -> None:
    """JAX in float64 with the persistent compilation cache (and, with --distributed, its
    processes joined): the first import of JAX, once the arguments are valid."""
    import jax

    from .solve._devices import enable_compilation_cache, start_distributed

    jax.config.update("jax_enable_x64", True)
    enable_compilation_cache()
    if getattr(args, "distributed", False):
        start_distributed()


#: the exit status of a command whose output's reader went away (128 + SIGPIPE, as the
#: shell reports a writer that a closed pipe ended)
CLOSED_PIPE = 141
#: the exit status of a command whose work is done but whose output could not be written
#: (a full device): EX_IOERR of sysexits.h
OUTPUT_FAILED = 74


class _Output:
    """The command's standard output: a write that fails with an OS error other than a
    closed pipe (`> /dev/full`) is kept in `error` and the rest of the output dropped, so
    that a finished run is not turned into a traceback; `main` then says so."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def _do(self, fn, *args):
        if self.error is None:
            try:
                fn(*args)
            except BrokenPipeError:
                raise
            except OSError as e:
                self.error = e

    def write(self, text: str) -> int:
        self._do(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._do(self.stream.flush)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv=None) -> int:
    out = sys.stdout = _Output(sys.stdout)
    try:
        try:
            code = _main(argv)
        finally:  # what is buffered goes out now, where a closed pipe is still caught
            sys.stdout.flush()
    except BrokenPipeError:  # `polarize sweep | head -1`: the reader is gone, not an error of ours
        _drop_output()
        return CLOSED_PIPE
    finally:
        sys.stdout = out.stream
    if out.error is None:
        return code
    _drop_output()
    reason = out.error.strerror or type(out.error).__name__
    print(
        f"polarize: error: the output could not be written ({reason}); what the command wrote "
        "to disk is complete",
        file=sys.stderr,
    )
    return OUTPUT_FAILED


def _drop_output() -> None:
    """Later writes to standard output go nowhere (the interpreter's last flush included)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        job = args.func(args)  # validated without JAX
        _start_jax(args)
        return job()
    except PolarizeError as e:
        print(f"polarize: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # XLA could not allocate a program's buffers: one line, not a traceback
        jax = sys.modules.get("jax")  # loaded once a job runs; the arguments are parsed without it
        if jax is None or not isinstance(e, jax.errors.JaxRuntimeError) or "RESOURCE_EXHAUSTED" not in str(e):
            raise
        reason = str(e).strip().splitlines()[0]
        print(
            f"polarize: error: out of memory ({reason}); finished chunks are on disk. Ask for less "
            "at once: --chunk-size, --n-save or --samples for a sweep (see the memory estimate "
            "in docs/cli.md)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("polarize: interrupted; finished work is on disk", file=sys.stderr)
        return 130


#: Collections of the middle generation between two full ones in a command (`run`).
FULL_COLLECTION_EVERY = 100


def run() -> None:
    """The `polarize` command: `main`, with its exit status.

    The process is the command's own, so it sets Python's garbage collector for a
    short run that allocates millions of objects and frees few (importing JAX, tracing a
    program): full collections of the oldest generation after 100 collections of the
    middle one instead of 10. Each full collection scans the whole heap for nothing here
    (0.2 s of a cold default sweep, benchmarks/NOTES.md); the young generations, where
    a command's garbage dies, are still collected as before."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
