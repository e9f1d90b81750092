"""Induction and classification runs: a grid of (normalization, layers, heads, lr) variants,
each trained for several seeds at once; one resumable result file per (variant, seed).

A result directory holds `config.json` (everything to rerun), `units/*.npz` (one per
finished run, written atomically: an interrupted run restarts where it stopped),
`summary.json` and figures. Run `s` of a grid with base seed `seed` uses the key
`fold_in(key(seed), s)` alone, whatever else is in the grid.
"""

import importlib.metadata
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import sinks
from ..errors import PolarizeError, check_choice, check_positive
from ..storage import read_json, read_npz, write_json, write_npz
from . import figures, tasks, train
from .attention import NORMALIZATIONS, make_normalization
from .model import Transformer

TASKS = ("induction", "classify")
QUALIFY = 0.95  # induction accuracy a run needs for its heads to count
SINK_HEAD = 0.9  # BOS share above which a head is a sink head

_COMMON = dict(width=64, batch=256, seed=0, test_size=1000, weight_decay=0.01)
PRESETS = {
    "induction": {
        "default": dict(
            _COMMON,
            norms=["softmax", "sigmoid", "sigmoid-norm", "elu", "linear"],
            layers=[2],
            heads=[4],
            lrs=[3e-3],
            seeds=3,
            epochs=4,
            train_size=51200,
            shift_query=False,
            positions="learned",
        ),
        "small": dict(
            _COMMON,
            norms=["softmax", "sigmoid"],
            layers=[2],
            heads=[2],
            lrs=[3e-3],
            seeds=2,
            epochs=2,
            train_size=2048,
            batch=64,
            width=16,
            test_size=128,
            shift_query=False,
            positions="learned",
        ),
        "paper": dict(
            _COMMON,
            norms=["softmax", "sigmoid", "sigmoid-norm", "elu", "elu-norm", "linear", "linear-norm"],
            layers=[2],
            heads=[1, 2, 4, 8],
            lrs=[1e-2, 1e-3, 1e-4],
            seeds=5,
            epochs=10,
            train_size=100000,
            width=128,
            shift_query=False,
            positions="learned",
        ),
    },
    "classify": {
        "default": dict(
            _COMMON,
            norms=["softmax", "sigmoid", "sigmoid-norm", "elu", "linear"],
            layers=[1, 2],
            heads=[1, 4],
            lrs=[3e-3],
            seeds=3,
            epochs=2,
            train_size=12800,
            pairs=500,
            positions="none",
        ),
        "small": dict(
            _COMMON,
            norms=["softmax", "sigmoid"],
            layers=[1],
            heads=[2],
            lrs=[3e-3],
            seeds=2,
            epochs=2,
            train_size=1024,
            batch=64,
            width=16,
            test_size=128,
            pairs=64,
            positions="none",
        ),
        "paper": dict(
            _COMMON,
            norms=["softmax", "sigmoid", "sigmoid-norm", "elu", "elu-norm", "linear", "linear-norm"],
            layers=[1, 2, 4],
            heads=[1, 2, 4, 8],
            lrs=[1e-3],
            seeds=5,
            epochs=10,
            train_size=100000,
            width=128,
            pairs=500,
            positions="none",
        ),
    },
}


def make_config(task: str, preset: str = "default", **overrides) -> dict:
    """The preset's settings with `overrides` (None = keep), validated."""
    check_choice("task", task, TASKS)
    config = dict(PRESETS[task][check_choice("preset", preset, PRESETS[task])])
    config.update({k: v for k, v in overrides.items() if v is not None})
    for name in config["norms"]:
        check_choice("norms", name, NORMALIZATIONS)
    for name in ("width", "seeds", "epochs", "train_size", "batch", "test_size"):
        check_positive(name.replace("_", "-"), config[name], integer=True)
    for h in config["heads"]:
        check_positive("heads", h, integer=True)
        if config["width"] % h:
            raise PolarizeError(f"`heads` must divide `width`={config['width']}; got {h}")
    for n in config["layers"]:
        check_positive("layers", n, integer=True)
    for lr in config["lrs"]:
        check_positive("lr", lr)
    if config["batch"] > config["train_size"]:
        raise PolarizeError(
            f"`batch` must be at most `train-size`={config['train_size']}; got {config['batch']}"
        )
    return dict(task=task, preset=preset, **config)


def versions() -> dict:
    names = ("jax", "jaxlib", "equinox", "optax", "numpy")
    return dict(python=sys.version.split()[0], **{n: importlib.metadata.version(n) for n in names})


def variants(config: dict) -> list[dict]:
    return [
        dict(norm=n, layers=la, heads=h, lr=lr)
        for n in config["norms"]
        for la in config["layers"]
        for h in config["heads"]
        for lr in config["lrs"]
    ]


def unit_name(v: dict, seed: int) -> str:
    return f"{v['norm']}_L{v['layers']}_H{v['heads']}_lr{v['lr']:g}_s{seed}"


def prepare(out: Path, config: dict, overwrite: bool) -> None:
    """Create `out`, resume it if it holds this config, refuse or clear it otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`--out` must be a directory; got file {out}")
    stored = out / "config.json"
    if out.exists() and any(out.iterdir()):
        same = stored.exists() and _without_versions(read_json(stored)) == config
        if not same and not overwrite:
            raise PolarizeError(
                f"`--out` {out} is not empty and holds a different config (or none); "
                "pass --overwrite to replace it or choose another directory"
            )
        if not same:
            shutil.rmtree(out / "units", ignore_errors=True)
            for f in [stored, out / "summary.json", *out.glob("*.png")]:
                f.unlink(missing_ok=True)
    write_json(stored, dict(config, versions=versions()))


def _without_versions(stored: dict) -> dict:
    return {k: v for k, v in stored.items() if k != "versions"}


def _model_maker(config: dict, v: dict, vocab: int, out_vocab: int, causal: bool):
    def make(key):
        return Transformer(
            vocab,
            out_vocab,
            width=config["width"],
            layers=v["layers"],
            heads=v["heads"],
            norm=v["norm"],
            causal=causal,
            positions=config["positions"],
            key=key,
        )

    return make


def _forward(models, x):
    """Logits and attention maps of stacked models on a batch: `[seeds, n, ...]`."""
    return eqx.filter_vmap(lambda m: jax.vmap(m.forward)(x), in_axes=(eqx.if_array(0),))(models)


def _train_induction(config, v, keys):
    k_init, k_data, k_shuffle, k_test = (keys[:, i] for i in range(4))
    vocab = tasks.induction_vocab(50, config["shift_query"])
    models = train.stack_models(_model_maker(config, v, vocab, vocab, True), k_init)
    gen = lambda k, n: tasks.induction(k, n, shift_query=config["shift_query"])
    data = jax.vmap(lambda k: gen(k, config["train_size"]))(k_data)
    models, history = train.fit(
        models,
        train.induction_loss,
        data,
        k_shuffle,
        lr=v["lr"],
        epochs=config["epochs"],
        batch=config["batch"],
        weight_decay=config["weight_decay"],
    )
    results = []
    for s in range(keys.shape[0]):
        x, y = gen(k_test[s], config["test_size"])
        model = jax.tree.map(lambda a: a[s] if eqx.is_array(a) else a, models)
        logits, full = jax.vmap(model.forward)(x)
        maps = full[..., 1:, :]  # query 0 sees only BOS under causal masking: not informative
        results.append(
            dict(
                accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y[:, -1]),
                sink_score=jnp.mean(sinks.bos_share(maps), 0),
                alpha0=jnp.mean(sinks.importance(full)[..., 0], 0),
                sparsity=jnp.mean(sinks.sparsity(maps), 0),
                entropy=jnp.mean(sinks.mean_entropy(maps), 0),
                example=jax.vmap(model.forward)(x[:1])[1][0],
                loss=history[s],
            )
        )
    return results


def _train_classify(config, v, keys):
    k_init, k_data, k_shuffle, k_test = (keys[:, i] for i in range(4))
    models = train.stack_models(_model_maker(config, v, 41, 4, False), k_init)
    data = jax.vmap(lambda k: tasks.classification(k, config["train_size"]))(k_data)
    models, history = train.fit(
        models,
        train.classification_loss,
        data,
        k_shuffle,
        lr=v["lr"],
        epochs=config["epochs"],
        batch=config["batch"],
        weight_decay=config["weight_decay"],
    )
    results = []
    for s in range(keys.shape[0]):
        model = jax.tree.map(lambda a: a[s] if eqx.is_array(a) else a, models)
        kt, ka, kb, kshift, kpos = jax.random.split(k_test[s], 5)
        x, y = tasks.classification(kt, config["test_size"])
        logits, maps = jax.vmap(model.forward)(x)
        cls_rows = maps[..., -1:, :]  # [n, layers, heads, 1, keys]
        # single-token attack: A and B of different classes
        n = config["pairs"]
        xa, la = tasks.classification(ka, n)
        lb = (la + jax.random.randint(kshift, (n,), 1, 4)) % 4
        xb, _ = tasks.classification(kb, n, labels=lb)
        _, maps_a = jax.vmap(model.forward)(xa)
        attention_a = jnp.mean(maps_a[:, -1, :, -1, :], axis=1)  # last layer, heads averaged
        attacked = tasks.single_token_attack(kpos, xa, xb, attention_a)
        pred = jnp.argmax(jax.vmap(model)(attacked)[:, -1], -1)
        pred_b = jnp.argmax(jax.vmap(model)(xb)[:, -1], -1)
        results.append(
            dict(
                accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y),
                flip_rate=jnp.mean(pred == la),
                clean_b_accuracy=jnp.mean(pred_b == lb),
                sparsity=jnp.mean(sinks.sparsity(cls_rows), 0),
                entropy=jnp.mean(sinks.mean_entropy(cls_rows), 0),
                example=maps[0],
                loss=history[s],
            )
        )
    return results


def run(config: dict, out, *, overwrite: bool = False, log: Callable = print) -> dict:
    """Train every unfinished (variant, seed) of `config` into `out`; return the summary."""
    out = Path(out)
    prepare(out, config, overwrite)
    trainer = _train_induction if config["task"] == "induction" else _train_classify
    base = jax.random.key(config["seed"])
    for v in variants(config):
        todo = [s for s in range(config["seeds"]) if not (out / "units" / f"{unit_name(v, s)}.npz").exists()]
        if not todo:
            continue
        start = time.perf_counter()
        keys = jnp.stack([jax.random.split(jax.random.fold_in(base, s), 4) for s in todo])
        for s, result in zip(todo, trainer(config, v, keys)):
            arrays = {k: np.asarray(val) for k, val in result.items()}
            write_npz(out / "units" / f"{unit_name(v, s)}.npz", dict(arrays, seed=np.asarray(s)))
        log(f"{unit_name(v, 0)[:-3]}: {len(todo)} seeds in {time.perf_counter() - start:.1f}s", flush=True)
    summary = summarize(config, out)
    write_json(out / "summary.json", summary)
    figures.draw(config, summary, load_units(config, out), out)
    return summary


def load_units(config: dict, out: Path) -> list[dict]:
    units = []
    for v in variants(config):
        for s in range(config["seeds"]):
            path = Path(out) / "units" / f"{unit_name(v, s)}.npz"
            if path.exists():
                units.append({**read_npz(path), **v, "seed": s})
    return units


def summarize(config: dict, out: Path) -> dict:
    """Per normalization (and per variant): run counts and the paper's metrics."""
    units = load_units(config, out)
    groups: dict = {"by_norm": {}, "by_variant": {}}
    for key, select in [("by_norm", lambda u: u["norm"]), ("by_variant", lambda u: unit_name(u, 0)[:-3])]:
        for name in dict.fromkeys(select(u) for u in units):
            group = [u for u in units if select(u) == name]
            norm = group[0]["norm"]
            entry = dict(
                normalized=make_normalization(norm, 1).normalized,
                runs=len(group),
                accuracy=float(np.mean([u["accuracy"] for u in group])),
                sparsity=float(np.mean([u["sparsity"].mean() for u in group])),
            )
            if config["task"] == "induction":
                ok = [u for u in group if u["accuracy"] > QUALIFY]
                scores = np.concatenate([u["sink_score"].ravel() for u in ok] or [np.zeros(0)])
                entry.update(
                    qualified=len(ok),
                    heads_counted=int(scores.size),
                    sink_heads=int(np.sum(scores > SINK_HEAD)),
                    sink_share=float(np.mean(scores > SINK_HEAD)) if ok else None,
                    mean_sink_score=float(np.mean(scores)) if ok else None,
                    gu_sink_share=float(
                        np.mean(np.concatenate([u["alpha0"].ravel() for u in ok]) > sinks.SINK_EPS)
                    )
                    if ok
                    else None,
                )
            else:
                entry.update(
                    flip_rate=float(np.mean([u["flip_rate"] for u in group])),
                    pairs=len(group) * config["pairs"],
                )
            groups[key][name] = entry
    return dict(
        task=config["task"],
        units=len(units),
        expected_units=len(variants(config)) * config["seeds"],
        **groups,
    )
