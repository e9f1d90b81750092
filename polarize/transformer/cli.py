"""`polarize induction | classify | sinks`: parse, validate, call the transformer lab.

The lab's code (and JAX) is imported only once a command's arguments are valid.
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np

from ..core._choices import SINK_EPS, SINK_MASS, SINK_MASSES
from ..core._errors import PolarizeError, check_choice, check_positive
from ..runs._storage import read_npz
from . import _pretrained  # no torch until a model is loaded

# the figure formats matplotlib's own backends write (`FigureCanvasBase.get_supported_filetypes`,
# less pgf, which needs LaTeX, and raw pixel dumps); listed here so that parsing needs no matplotlib
FIGURE_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def _list(kind):
    def parse(text: str) -> list:
        return [kind(t) for t in text.split(",") if t.strip()]

    return parse


def _grid_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="result directory")
    # default None: `_grid` tells an explicit `--preset` from the default, to refuse it with `--small`
    p.add_argument(
        "--preset",
        help="cpu (the paper's budget on 2 CPU cores, < 25 min), small (seconds) or "
        "paper (the paper's grid, a GPU job) (default cpu)",
    )
    p.add_argument("--small", action="store_true", help="same as --preset small")
    preset = "(default: the preset's)"
    p.add_argument("--norms", help=f"comma-separated attention normalizations {preset}")
    p.add_argument("--seeds", type=int, help=f"number of seeds per variant {preset}")
    p.add_argument("--seed", type=int, help="base seed: run s uses fold_in(key(seed), s) (default 0)")
    p.add_argument("--heads", help=f"comma-separated head counts {preset}")
    p.add_argument("--layers", help=f"comma-separated layer counts {preset}")
    p.add_argument("--width", type=int, help=f"model width {preset}")
    p.add_argument("--lr", help=f"comma-separated AdamW learning rates {preset}")
    p.add_argument("--epochs", type=int, help=f"passes over the training set {preset}")
    p.add_argument("--train-size", type=int, help=f"training sequences per seed {preset}")
    p.add_argument("--batch", type=int, help=f"batch size {preset}")
    p.add_argument("--positions", help=f"position encoding: add, concat, none or rope {preset}")
    p.add_argument(
        "--record-every", type=int, help=f"record the probe every this many steps (0: per epoch) {preset}"
    )
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
    if args.small and args.preset not in (None, "small"):
        raise PolarizeError(
            f"`--small` is `--preset small`; give one of them, not both (got `--preset {args.preset}`)"
        )
    preset = "small" if args.small else (args.preset or "cpu")
    lists = {
        "norms": _parse_list("norms", args.norms, str),
        "heads": _parse_list("heads", args.heads, int),
        "layers": _parse_list("layers", args.layers, int),
        "lrs": _parse_list("lr", args.lr, float),
    }
    return lambda: _run_grid(task, args, preset, lists)


def _run_grid(task: str, args, preset: str, lists: dict) -> int:
    from . import experiments  # the lab's training code and figures: only when it runs

    config = experiments.make_config(
        task,
        preset,
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
    """`polarize sinks FILE.npz` (maps already exported) or `--model ...` (streamed from a
    transformers checkpoint, `_pretrained`): checked here, without JAX or torch."""
    if (args.file is None) == (args.model is None):
        raise PolarizeError("give either FILE (attention maps in a .npz) or `--model`, not both or neither")
    if args.eps is None or not 0 <= args.eps < 1:
        raise PolarizeError(f"`--eps` must be in [0, 1); got {args.eps}")
    if args.k < 0:
        raise PolarizeError(f"`--k` must be a key position >= 0; got {args.k}")
    check_choice("--mass", args.mass, SINK_MASSES)
    for flag in ("out", "json"):
        path = getattr(args, flag)
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise PolarizeError(f"`--{flag}` {path!r} is in no existing folder")
        if path is not None and Path(path).is_dir():
            raise PolarizeError(f"`--{flag}` {path!r} is a folder; name a file")
    out = None if args.out is None else _figure_file(args.out)
    if args.model is not None:
        return _sinks_model(args, out)
    for flag in ("text", "token_ids", "revisions", "steps"):
        if getattr(args, flag) is not None:
            raise PolarizeError(f"`--{flag.replace('_', '-')}` applies to `--model` only, not to FILE")
    path = Path(args.file)
    if not path.is_file():
        raise PolarizeError(f"`FILE` must be an existing .npz file; got {str(path)!r}")
    try:
        arrays = read_npz(path)
    except ValueError as e:
        raise PolarizeError(f"`FILE` {str(path)!r} is not a readable .npz: {e}") from None
    key = args.key
    if key is None and not arrays:
        raise PolarizeError(f"`FILE` {str(path)!r} holds no arrays")
    if key is None and "attention" not in arrays and len(arrays) > 1:
        raise PolarizeError(
            f"`FILE` {str(path)!r} holds several arrays ({', '.join(arrays)}); name one with `--key`"
        )
    if key is None:
        key = "attention" if "attention" in arrays else next(iter(arrays))
    if key not in arrays:
        raise PolarizeError(f"`--key` must be one of {', '.join(arrays)}; got {key!r}")
    a = np.asarray(arrays[key])
    if a.ndim not in (3, 4, 5) or not np.issubdtype(a.dtype, np.number):
        raise PolarizeError(
            f"`--key` {key!r} must hold numbers shaped [heads, q, k], [layers, heads, q, k] "
            f"or [batch, layers, heads, q, k]; got {a.dtype} {a.shape}"
        )
    axes = ("batch", "layers", "heads", "queries", "keys")[-a.ndim :]
    empty = [name for name, n in zip(axes, a.shape) if n == 0]
    if empty:
        raise PolarizeError(
            f"`FILE` {str(path)!r} holds maps with no {' and no '.join(empty)}: {key!r} is shaped {a.shape}"
        )
    if a.shape[-1] == a.shape[-2] and not args.k < a.shape[-1]:
        raise PolarizeError(f"`--k` must be a key position in 0..{a.shape[-1] - 1}; got {args.k}")
    return lambda: _run_sinks(args, path, key, a, out or path.with_suffix(".png"))


def _figure_file(out: str) -> Path:
    """The figure file of `--out`: `.png` added when it has no suffix (as matplotlib would);
    refused when its suffix is no format matplotlib writes, or it names a folder."""
    name = os.fspath(out)
    suffix = os.path.splitext(name)[1][1:]
    if not suffix:
        name = name.rstrip(".") + ".png"
    elif suffix.lower() not in FIGURE_FORMATS:
        raise PolarizeError(
            f"`--out` must end in one of {', '.join('.' + f for f in FIGURE_FORMATS)} "
            f"(or no suffix: .png); got {out!r}"
        )
    if Path(name).is_dir():
        raise PolarizeError(f"`--out` {out!r} would write {name!r}, which is a folder; name a file")
    return Path(name)


def _sink_code():
    """The sink metrics and their figures (JAX, matplotlib): imported by the jobs only,
    once the arguments are valid; the one lazy import of the sinks commands."""
    from ..measure import sinks
    from . import figures

    return sinks, figures


def _run_sinks(args, path: Path, key: str, a: np.ndarray, out: Path) -> int:
    sinks, figures = _sink_code()
    table = sinks.head_table(a, eps=args.eps, key=args.k, mass=args.mass)
    print(sinks.format_table(table, eps=args.eps))
    figures.heatmap(table, out, title=f"{path.name}: {key}")
    print(f"figure: {out}")
    if args.json:
        batch = a.shape[0] if a.ndim == 5 else 1
        _write_json(args.json, _record(table, args, sequences=batch, tokens=int(a.shape[-1]), file=str(path)))
    return 0


def _finite(x) -> float | None:
    return None if x != x else float(x)


def _finite_mean(values) -> float:
    """Mean over the finite heads (NaN when none is)."""
    finite = np.isfinite(values)
    return float(values[finite].mean()) if finite.any() else float("nan")


def _record(table: dict, args, **info) -> dict:
    """The JSON of one scored set of maps (the same for FILE and `--model`): per-head alpha
    (`[layers][heads]`, NaN as null) averaged over sequences, the overall sink rate."""
    layers, heads = table["bos_share"].shape
    record = dict(info)
    if "alpha" in table:
        record["alpha"] = [[_finite(v) for v in row] for row in table["alpha"]]
        record["sink_rate"] = _finite(table["sink_share_all"])
    record.update(
        k=args.k,
        eps=args.eps,
        mass=args.mass,
        layers=layers,
        heads=heads,
        nonfinite=table["nonfinite"],
        status=[
            ["nonfinite" if not ok else ("sink" if "sink" in table and s else "-") for ok, s in zip(oks, ss)]
            for oks, ss in zip(table["finite"], table.get("sink", table["finite"]))
        ],
    )
    return record


def _write_json(path, record) -> None:
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"json: {path}")


def _read_token_ids(path: Path, max_tokens: int) -> list[np.ndarray]:
    if not path.is_file():
        raise PolarizeError(f"`--token-ids` must be an existing .npy file; got {str(path)!r}")
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise PolarizeError(f"`--token-ids` {str(path)!r} is not a readable .npy: {e}") from None
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise PolarizeError(
            f"`--token-ids` must hold integers shaped [sequences, tokens]; got {ids.dtype} {ids.shape}"
        )
    if ids.min() < 0:
        raise PolarizeError(f"`--token-ids` must be token ids >= 0; got {int(ids.min())}")
    return list(ids[:, :max_tokens].astype(np.int64))


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise PolarizeError(f"`--text` must be an existing text file; got {str(path)!r}")
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise PolarizeError(f"`--text` {str(path)!r} is not readable UTF-8 text: {e}") from None
    if not lines:
        raise PolarizeError(f"`--text` {str(path)!r} has no non-empty line (one sequence per line)")
    return lines


def _sinks_model(args, out: Path | None):
    missing = _pretrained.missing_packages()
    if missing:
        raise PolarizeError(f"`--model` needs {' and '.join(missing)}: {_pretrained.LLM_EXTRA}")
    if args.key is not None:
        raise PolarizeError("`--key` applies to FILE only, not to `--model`")
    if args.text is not None and args.token_ids is not None:
        raise PolarizeError("give `--text FILE` or `--token-ids FILE.npy` with `--model`, not both")
    if args.text is None and args.token_ids is None:
        raise PolarizeError("`--model` needs either `--text FILE` or `--token-ids FILE.npy`")
    max_tokens = check_positive("--max-tokens", args.max_tokens, integer=True)
    if not args.k < max_tokens:
        raise PolarizeError(f"`--k` must be below `--max-tokens` ({max_tokens}); got {args.k}")
    if args.revisions is not None and len(args.model) != 1:
        raise PolarizeError("`--revisions` needs exactly one `--model` NAME")
    checkpoints = [(m, r) for m in args.model for r in (args.revisions or [None])]
    for name, _ in checkpoints:
        looks_local = name.startswith(("/", "./", "../", "~")) or Path(name).exists()
        if looks_local and not Path(name).expanduser().is_dir():
            raise PolarizeError(f"`--model` {name!r} is not a folder of a saved model")
    if args.steps is not None:
        if len(args.steps) != len(checkpoints):
            raise PolarizeError(
                f"`--steps` needs one step per checkpoint ({len(checkpoints)}); got {len(args.steps)}"
            )
        steps = list(args.steps)
    else:
        steps = [_pretrained.training_step(n, r) for n, r in checkpoints]
        unknown = [r or n for (n, r), s in zip(checkpoints, steps) if s is None]
        if len(checkpoints) > 1 and unknown:
            raise PolarizeError(
                f"cannot tell the training step of {unknown[0]!r}: name it checkpoint-N or stepN, "
                "keep its trainer_state.json, or give `--steps`"
            )
    if args.token_ids is not None:
        source = _read_token_ids(Path(args.token_ids), max_tokens)
        shortest = min(len(s) for s in source)
        if not args.k < shortest:
            raise PolarizeError(f"`--k` must be below the number of tokens ({shortest}); got {args.k}")
    else:
        source = _read_lines(Path(args.text))
    return lambda: _run_sinks_model(args, checkpoints, steps, source, max_tokens, out)


def _sequences(args, model, name: str, revision, source, max_tokens: int) -> list[np.ndarray]:

    if args.text is not None:
        tok = _pretrained.tokenizer(name, revision)
        source = [np.asarray(tok(line)["input_ids"][:max_tokens], dtype=np.int64) for line in source]
    vocab = _pretrained.vocab_size(model)
    top = max(int(s.max()) for s in source if len(s))
    if top >= vocab:
        raise PolarizeError(
            f"`--token-ids` holds id {top}, outside the vocabulary of {name!r} (0..{vocab - 1})"
        )
    shortest, longest = min(len(s) for s in source), max(len(s) for s in source)
    if not args.k < shortest:
        raise PolarizeError(f"`--k` must be below the number of tokens of every sequence: {shortest}")
    limit = _pretrained.max_positions(model)
    if limit is not None and longest > limit:
        raise PolarizeError(f"{name!r} takes at most {limit} tokens; lower `--max-tokens` (now {max_tokens})")
    return source


def _run_sinks_model(args, checkpoints, steps, source, max_tokens: int, out: Path | None) -> int:
    import transformers

    sinks, figures = _sink_code()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    rows, records = [], []
    for (name, revision), step in zip(checkpoints, steps):
        model = _pretrained.load(name, revision)
        sequences = _sequences(args, model, name, revision, source, max_tokens)
        metrics = _pretrained.stream_metrics(model, sequences, key=args.k, mass=args.mass)
        del model
        table = sinks.summarize_heads(metrics, eps=args.eps, key=args.k, mass=args.mass)
        lengths = sorted({len(s) for s in sequences})
        tokens = lengths[0] if len(lengths) == 1 else [len(s) for s in sequences]
        label = name + (f"@{revision}" if revision else "")
        at = "" if step is None else f" (step {step})"
        span = f"{lengths[0]}..{lengths[-1]}" if len(lengths) > 1 else f"{lengths[0]}"
        print(f"{label}{at}: {len(sequences)} sequences of {span} tokens, mass {args.mass}")
        print(sinks.format_table(table, eps=args.eps))
        records.append(
            _record(
                table, args, model=name, revision=revision, step=step, sequences=len(sequences), tokens=tokens
            )
        )
        rows.append(
            dict(
                checkpoint=label,
                model=name,
                revision=revision or "",
                step=step,
                sink_rate=table["sink_share_all"],
                mean_alpha=float(np.nanmean(table["alpha"]))
                if table["nonfinite"] < table["alpha"].size
                else None,
                bos_share=float(np.nanmean(table["bos_share"]))
                if table["nonfinite"] < table["alpha"].size
                else None,
                nonfinite=table["nonfinite"],
                layers=table["alpha"].shape[0],
                heads=table["alpha"].shape[1],
                sequences=len(sequences),
            )
        )
    if len(checkpoints) == 1:
        out = out or Path("sinks.png")
        figures.heatmap(table, out, title=rows[0]["checkpoint"])
        print(f"figure: {out}")
    else:
        import pandas as pd

        out = out or Path("sinks-series.png")
        frame = pd.DataFrame(rows)
        frame.to_csv(out.with_suffix(".csv"), index=False)
        figures.sink_series(frame, out, title=f"Sink_{args.k}^{args.eps}, mass {args.mass}")
        print(frame.to_string(index=False, columns=["checkpoint", "step", "sink_rate", "mean_alpha"]))
        print(f"table: {out.with_suffix('.csv')}\nfigure: {out}")
    if args.json:
        _write_json(args.json, records[0] if len(records) == 1 else records)
    return 0


def add_subcommands(subparsers) -> None:
    """Register `induction`, `classify` and `sinks` on an argparse subparsers object."""
    p = subparsers.add_parser("induction", help="train transformers on the induction task")
    _grid_options(p)
    p.add_argument(
        "--shift-query",
        action=argparse.BooleanOptionalAction,
        help="write the repeated (query) token as token + vocab (default on, as in the paper)",
    )
    p.add_argument(
        "--aux-weight", type=float, help="weight of the loss at the non-final positions (default 0.2)"
    )
    p.set_defaults(func=lambda a: _grid("induction", a))
    p = subparsers.add_parser("classify", help="train classifiers, attack single tokens")
    _grid_options(p)
    p.set_defaults(func=lambda a: _grid("classify", a))
    p = subparsers.add_parser(
        "sinks",
        help="per-head sink table of attention maps: from a .npz, or streamed from a transformers model",
        description="Attention maps shaped [heads, q, k], [layers, heads, q, k] or "
        "[batch, layers, heads, q, k] (batch averaged) from FILE, or computed by a causal LM "
        "that transformers loads with eager attention (--model, needs the llm extra), one "
        "layer at a time. Prints per-head metrics, Sink_k^eps per layer and over all layers "
        "x heads (Gu et al.); a map with any weight above the diagonal is bidirectional and "
        "alpha_k averages over all queries, else over i >= k. Several checkpoints (--model "
        "DIR1 DIR2 ..., or --model NAME --revisions r1 r2 ...) give one CSV row each and a "
        "figure against the training step. NaN or inf weights mark a head nonfinite.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", help=".npz file with attention maps")
    p.add_argument("--key", help="array name in FILE (default: 'attention' or the only one)")
    p.add_argument("--model", nargs="+", metavar="PATH_OR_NAME", help="saved model folder(s) or hub name")
    p.add_argument("--revisions", nargs="+", metavar="REV", help="hub revisions of one --model NAME")
    p.add_argument(
        "--steps", nargs="+", type=int, help="training step of each checkpoint (default: from the name)"
    )
    p.add_argument("--text", help="text file, one sequence per line (with --model)")
    p.add_argument("--token-ids", help=".npy of token ids, [sequences, tokens] (with --model)")
    p.add_argument(
        "--max-tokens", type=int, default=256, help="cut each sequence to this length (default 256)"
    )
    p.add_argument(
        "--mass",
        default=SINK_MASS,
        help=f"how rows are read: {', '.join(SINK_MASSES)} (default {SINK_MASS}: |A| / sum |A|)",
    )
    p.add_argument(
        "--out",
        help=f"figure file, {', '.join(FIGURE_FORMATS)} (no suffix: .png; default: FILE with .png, "
        "sinks.png, sinks-series.png)",
    )
    p.add_argument("--json", help="also write alpha [layers][heads], sink_rate, ... to this JSON file")
    p.add_argument("--k", type=int, default=0, help="key position k of Sink_k^eps (default 0)")
    p.add_argument("--eps", type=float, default=SINK_EPS, help="threshold eps (default 0.3)")
    p.set_defaults(func=_sinks)
