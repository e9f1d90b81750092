"""`polarize induction | classify | sinks`: parse, validate, call the transformer lab.

The lab's code (and JAX) is imported only once a command's arguments are valid.
"""

import argparse
from pathlib import Path

import numpy as np

from ..core._choices import SINK_EPS
from ..core._errors import PolarizeError
from ..runs._storage import read_npz


def _list(kind):
    def parse(text: str) -> list:
        return [kind(t) for t in text.split(",") if t.strip()]

    return parse


def _grid_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="result directory")
    p.add_argument(
        "--preset",
        default="cpu",
        help="cpu (the paper's budget on 2 CPU cores, < 25 min), small (seconds) or "
        "paper (the paper's grid, a GPU job)",
    )
    p.add_argument("--small", action="store_true", help="same as --preset small")
    p.add_argument("--norms", help="comma-separated attention normalizations")
    p.add_argument("--seeds", type=int, help="number of seeds per variant")
    p.add_argument("--seed", type=int, help="base seed: run s uses fold_in(key(seed), s)")
    p.add_argument("--heads", help="comma-separated head counts")
    p.add_argument("--layers", help="comma-separated layer counts")
    p.add_argument("--width", type=int, help="model width")
    p.add_argument("--lr", help="comma-separated AdamW learning rates")
    p.add_argument("--epochs", type=int, help="passes over the training set")
    p.add_argument("--train-size", type=int, help="training sequences per seed")
    p.add_argument("--batch", type=int, help="batch size")
    p.add_argument("--positions", help="position encoding: add, concat, none or rope")
    p.add_argument("--record-every", type=int, help="record the probe every this many steps (0: per epoch)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace a result directory that holds a different config"
    )


def _parse_list(name: str, text, kind):
    if text is None:
        return None
    try:
        values = _list(kind)(text)
    except ValueError:
        values = []
    if not values:
        raise PolarizeError(f"`--{name}` must be a comma-separated list of {kind.__name__}; got {text!r}")
    return values


def _grid(task: str, args):
    """Parse the lists; the job makes the lab's config (which checks the rest) and runs it."""
    lists = {
        "norms": _parse_list("norms", args.norms, str),
        "heads": _parse_list("heads", args.heads, int),
        "layers": _parse_list("layers", args.layers, int),
        "lrs": _parse_list("lr", args.lr, float),
    }
    return lambda: _run_grid(task, args, lists)


def _run_grid(task: str, args, lists: dict) -> int:
    from . import experiments  # the lab's training code and figures: only when it runs

    config = experiments.make_config(
        task,
        "small" if args.small else args.preset,
        **lists,
        seeds=args.seeds,
        seed=args.seed,
        width=args.width,
        epochs=args.epochs,
        train_size=args.train_size,
        batch=args.batch,
        positions=args.positions,
        record_every=args.record_every,
        shift_query=getattr(args, "shift_query", None),
        aux_weight=getattr(args, "aux_weight", None),
    )
    summary = experiments.run(config, args.out, overwrite=args.overwrite)
    for name, e in summary["by_norm"].items():
        if task == "induction":
            if e["sink_share"] is None:
                share = "n/a (no run reached accuracy 0.95)"
            else:
                lo, hi = e["sink_share_90"]
                share = (
                    f"{e['sink_share']:.3f} [90% {lo:.3f}, {hi:.3f}] ({e['sink_heads']}/{e['heads_counted']} "
                    f"heads), mean sink score {e['mean_sink_score']:.3f}"
                )
            print(
                f"{name:>16}: sink-head share {share}; {e['qualified']}/{e['runs']} runs qualified, "
                f"accuracy {e['accuracy']:.3f}"
            )
        else:
            print(
                f"{name:>18}: flip rate {e['flip_rate']:.3f} ({e['runs']} runs x "
                f"{config.pairs} pairs), accuracy {e['accuracy']:.3f}, "
                f"CLS sparsity {e['sparsity']:.3f}"
            )
    print(f"results in {args.out}")
    failed = summary.get("failed_runs", {})
    if failed:
        shown = "; ".join(f"{k}: {v}" for k, v in list(failed.items())[:5]) + (
            "; ..." if len(failed) > 5 else ""
        )
        print(
            f"{len(failed)} of {summary['units']} runs failed and are left out of the numbers above: {shown}"
        )
        return 1
    return 0


def _sinks(args):
    path = Path(args.file)
    if not path.is_file():
        raise PolarizeError(f"`FILE` must be an existing .npz file; got {str(path)!r}")
    try:
        arrays = read_npz(path)
    except ValueError as e:
        raise PolarizeError(f"`FILE` {str(path)!r} is not a readable .npz: {e}") from None
    key = args.key
    if key is None:
        key = "attention" if "attention" in arrays else (next(iter(arrays)) if len(arrays) == 1 else None)
    if key not in arrays:
        raise PolarizeError(f"`--key` must be one of {', '.join(arrays)}; got {key!r}")
    a = np.asarray(arrays[key])
    if a.ndim not in (3, 4, 5) or not np.issubdtype(a.dtype, np.number):
        raise PolarizeError(
            f"`--key` {key!r} must hold numbers shaped [heads, q, k], [layers, heads, q, k] "
            f"or [batch, layers, heads, q, k]; got {a.dtype} {a.shape}"
        )
    if args.eps is None or not 0 <= args.eps < 1:
        raise PolarizeError(f"`--eps` must be in [0, 1); got {args.eps}")
    if a.shape[-1] == a.shape[-2] and not 0 <= args.k < a.shape[-1]:
        raise PolarizeError(f"`--k` must be a key position in 0..{a.shape[-1] - 1}; got {args.k}")
    return lambda: _run_sinks(args, path, key, a)


def _run_sinks(args, path: Path, key: str, a: np.ndarray) -> int:
    from ..measure import sinks

    table = sinks.head_table(a, eps=args.eps, key=args.k)
    print(sinks.format_table(table, eps=args.eps))
    out = Path(args.out) if args.out else path.with_suffix(".png")
    from .figures import heatmap

    heatmap(table, out, title=f"{path.name}: {key}")
    print(f"figure: {out}")
    return 0


def add_subcommands(subparsers) -> None:
    """Register `induction`, `classify` and `sinks` on an argparse subparsers object."""
    p = subparsers.add_parser("induction", help="train transformers on the induction task")
    _grid_options(p)
    p.add_argument(
        "--shift-query",
        action=argparse.BooleanOptionalAction,
        help="write the repeated (query) token as token + vocab (the paper's default: on)",
    )
    p.add_argument("--aux-weight", type=float, help="weight of the loss at the non-final positions (0.2)")
    p.set_defaults(func=lambda a: _grid("induction", a))
    p = subparsers.add_parser("classify", help="train classifiers, attack single tokens")
    _grid_options(p)
    p.set_defaults(func=lambda a: _grid("classify", a))
    p = subparsers.add_parser(
        "sinks",
        help="per-head sink table of attention maps in a .npz",
        description="Attention maps shaped [heads, q, k], [layers, heads, q, k] or "
        "[batch, layers, heads, q, k] (batch averaged); any normalization, "
        "metrics use |A| renormalized per row. Prints per-head metrics, Sink_k^eps per layer "
        "and over all layers x heads (Gu et al.); a map with any weight above the diagonal "
        "is bidirectional and alpha_k averages over all queries, else over i >= k.",
    )
    p.add_argument("file", metavar="FILE", help=".npz file with attention maps")
    p.add_argument("--key", help="array name in FILE (default: 'attention' or the only one)")
    p.add_argument("--out", help="heatmap PNG (default: FILE with .png)")
    p.add_argument("--k", type=int, default=0, help="key position k of Sink_k^eps (default 0)")
    p.add_argument("--eps", type=float, default=SINK_EPS, help="threshold eps (default 0.3)")
    p.set_defaults(func=_sinks)
