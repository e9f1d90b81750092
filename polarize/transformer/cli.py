"""`polarize induction | classify | sinks`: parse, validate, call the transformer lab."""

import argparse
from pathlib import Path

import numpy as np

from .. import sinks
from ..errors import PolarizeError
from ..storage import read_npz
from . import experiments, figures


def _list(kind):
    def parse(text: str) -> list:
        return [kind(t) for t in text.split(",") if t.strip()]

    return parse


def _grid_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="result directory")
    p.add_argument(
        "--preset",
        default="default",
        help="default (CPU, < 15 min), small (seconds) or paper (the full grid, GPU)",
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


def _run_grid(task: str, args) -> int:
    config = experiments.make_config(
        task,
        "small" if args.small else args.preset,
        norms=_parse_list("norms", args.norms, str),
        heads=_parse_list("heads", args.heads, int),
        layers=_parse_list("layers", args.layers, int),
        lrs=_parse_list("lr", args.lr, float),
        seeds=args.seeds,
        seed=args.seed,
        width=args.width,
        epochs=args.epochs,
        train_size=args.train_size,
        batch=args.batch,
        **({"shift_query": True} if getattr(args, "shift_query", False) else {}),
    )
    summary = experiments.run(config, args.out, overwrite=args.overwrite)
    for name, e in summary["by_norm"].items():
        if task == "induction":
            fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
            print(
                f"{name:>18}: sink-head share {fmt(e['sink_share'])} ({e['sink_heads']}/"
                f"{e['heads_counted']} heads, {e['qualified']}/{e['runs']} runs qualified), "
                f"mean sink score {fmt(e['mean_sink_score'])}, "
                f"Sink_0^0.3 share {fmt(e['gu_sink_share'])}, "
                f"accuracy {e['accuracy']:.3f}, sparsity {e['sparsity']:.3f}"
            )
        else:
            print(
                f"{name:>18}: flip rate {e['flip_rate']:.3f} ({e['runs']} runs x "
                f"{config['pairs']} pairs), accuracy {e['accuracy']:.3f}, "
                f"CLS sparsity {e['sparsity']:.3f}"
            )
    print(f"results in {args.out}")
    return 0


def _sinks(args) -> int:
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
    table = sinks.head_table(a)
    print(sinks.format_table(table))
    out = Path(args.out) if args.out else path.with_suffix(".png")
    figures.heatmap(table, out, title=f"{path.name}: {key}")
    print(f"figure: {out}")
    return 0


def add_subcommands(subparsers) -> None:
    """Register `induction`, `classify` and `sinks` on an argparse subparsers object."""
    p = subparsers.add_parser("induction", help="train transformers on the induction task")
    _grid_options(p)
    p.add_argument(
        "--shift-query", action="store_true", help="write the repeated (query) token as token + vocab + 1"
    )
    p.set_defaults(func=lambda a: _run_grid("induction", a))
    p = subparsers.add_parser("classify", help="train classifiers, attack single tokens")
    _grid_options(p)
    p.set_defaults(func=lambda a: _run_grid("classify", a))
    p = subparsers.add_parser(
        "sinks",
        help="per-head sink table of attention maps in a .npz",
        description="Attention maps shaped [heads, q, k], [layers, heads, q, k] or "
        "[batch, layers, heads, q, k] (batch averaged); any normalization, "
        "metrics use |A| renormalized per row.",
    )
    p.add_argument("file", metavar="FILE", help=".npz file with attention maps")
    p.add_argument("--key", help="array name in FILE (default: 'attention' or the only one)")
    p.add_argument("--out", help="heatmap PNG (default: FILE with .png)")
    p.set_defaults(func=_sinks)
