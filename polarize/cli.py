"""The `polarize` command: a thin layer that parses, validates and calls the public API.

Bad input ends with one line `polarize: error: ...` and exit status 2, no traceback.
"""

import argparse
import sys
import time
from pathlib import Path

from .errors import PolarizeError

SUBCOMMANDS = []  # functions(subparsers) that register more subcommands


def _add_sweep(sub) -> None:
    from .normalizations import NORMALIZATIONS
    from .sweep import METHODS, OBJECTIVES, SOLVERS, SweepConfig

    d = SweepConfig()
    p = sub.add_parser(
        "sweep",
        help="Monte-Carlo study of polarization over many initializations",
        description="Run many initializations of the value-attention model under one setting "
        "and write config.json, summary.json, per-initialization arrays and weights.png. "
        "Defaults are the paper's logistic toy (softmax, T = d = 8, exact flow to t = 1e5).",
    )
    add = p.add_argument
    add("--objective", default=d.objective, help=f"one of {', '.join(OBJECTIVES)} (default %(default)s)")
    add("--norm", default=d.norm, help=f"one of {', '.join(NORMALIZATIONS)} (default %(default)s)")
    add("--temperature", type=float, default=d.temperature, help="softmax temperature")
    add("--sink", type=float, default=d.sink, help="softmax1 sink logit c")
    add("--tokens", type=int, default=d.tokens, help="T, number of tokens")
    add("--dim", type=int, default=d.dim, help="d, value dimension")
    add("--samples", type=int, default=d.samples, help="data points for logistic-data/square")
    add("--kappa", type=float, default=d.kappa, help="condition number of X (square loss)")
    add("--inits", type=int, default=d.inits, help="number of initializations")
    add("--method", default=d.method, help=f"one of {', '.join(METHODS)}: exact flow or gradient descent")
    add("--t1", type=float, default=d.t1, help="flow horizon")
    add("--rtol", type=float, default=d.rtol)
    add("--atol", type=float, default=d.atol)
    add("--solver", default=d.solver, help=f"one of {', '.join(SOLVERS)}")
    add("--lr", type=float, default=d.lr, help="GD learning rate")
    add("--steps", type=int, default=d.steps, help="GD steps")
    add("--v-scale", type=float, default=d.v_scale, help="V(0) ~ v_scale N(0,1)")
    add("--a-scale", type=float, default=d.a_scale, help="a(0) ~ a_offset + a_scale N(0,1)")
    add("--a-offset", type=float, default=d.a_offset)
    add("--seed", type=int, default=d.seed)
    add("--n-save", type=int, default=d.n_save, help="saved times (log-spaced)")
    add("--threshold", type=float, default=d.threshold, help="one-hot threshold on max weight")
    add("--chunk-size", type=int, default=d.chunk_size, help="initializations per chunk")
    add("--out", type=Path, default=None, help="output folder (default runs/sweep-<time>)")
    add("--overwrite", action="store_true", help="allow a non-empty --out")
    p.set_defaults(func=_sweep)


def _sweep(args) -> int:
    import dataclasses

    from .sweep import SweepConfig, result_line, run_sweep

    names = {f.name for f in dataclasses.fields(SweepConfig)}
    config = SweepConfig(**{k: v for k, v in vars(args).items() if k in names})
    out = args.out or Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
    summary = run_sweep(config, out, overwrite=args.overwrite)
    print(result_line(config, summary))
    print(f"results: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polarize",
        description="Training dynamics of softmax attention: gradient flow, polarization, sinks.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sweep(sub)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        return args.func(args)
    except PolarizeError as e:
        print(f"polarize: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("polarize: interrupted; finished work is on disk", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
