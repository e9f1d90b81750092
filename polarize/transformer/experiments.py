"""Induction and classification runs: a grid of (normalization, layers, heads, lr) variants,
each trained for several seeds at once; one resumable result file per (variant, seed).

A result directory holds `config.json` (everything to rerun), `units/*.npz` (one per
finished run, written atomically: an interrupted run restarts where it stopped),
`summary.json` and figures. Run `s` of a grid with base seed `seed` uses the key
`fold_in(key(seed), s)` alone, whatever else is in the grid.
"""

import dataclasses
import importlib.metadata
import sys
import time
from collections.abc import Callable
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from ..core._errors import PolarizeError, check_choice, check_positive
from ..measure import sinks
from ..runs._folder import FolderLock, check_out, folder_kind, make_folder, prepare_out
from ..runs._storage import read_json, read_npz, write_json, write_npz
from . import figures, train
from .attention import ATTENTIONS, make_attention
from .model import POSITIONS, Transformer

TASKS = ("induction", "classify")
QUALIFY = 0.95  # induction accuracy a run needs for its heads to count (the paper's)
SINK_HEAD = 0.9  # sink score above which a head is a sink head (the paper's)
PAPER_NORMS = (
    "softmax", "uniform", "sigmoid", "sigmoid-norm", "elu", "elu-norm",
    "elu-kernel", "elu-kernel-norm", "linear", "linear-norm", "mlp", "mlp-norm",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a grid of runs needs; validated at construction, stored as config.json.

    The grid is `norms x layers x heads x lrs`, each trained for `seeds` seeds. Induction
    uses `shift_query`, `aux_weight` and counts sink heads in layer `sink_layer` (the
    paper counts layer index 1); classification uses `pairs`. `record_every` > 0 records
    the task's probe (for induction the sink score per head) every that many steps.
    """

    task: str = "induction"
    preset: str = "custom"
    norms: tuple[str, ...] = ("softmax", "sigmoid")
    layers: tuple[int, ...] = (2,)
    heads: tuple[int, ...] = (4,)
    lrs: tuple[float, ...] = (1e-3,)
    seeds: int = 3
    seed: int = 0
    epochs: int = 10
    train_size: int = 100_000
    batch: int = 256
    test_size: int = 1000
    width: int = 128
    weight_decay: float = 0.01
    positions: str = "add"
    shift_query: bool = True
    aux_weight: float = 0.2
    sink_layer: int = 1
    pairs: int = 500
    record_every: int = 100
    probe_size: int = 256

    def __post_init__(self):
        check_choice("task", self.task, TASKS)
        check_choice("positions", self.positions, POSITIONS)
        for name in self.norms:
            check_choice("norms", name, ATTENTIONS)
        for name in ("width", "seeds", "epochs", "train_size", "batch", "test_size", "probe_size", "pairs"):
            check_positive(name.replace("_", "-"), getattr(self, name), integer=True)
        for h in self.heads:
            check_positive("heads", h, integer=True)
            if self.width % h:
                raise PolarizeError(f"`heads` must divide `width`={self.width}; got {h}")
        for n in self.layers:
            check_positive("layers", n, integer=True)
        for lr in self.lrs:
            check_positive("lr", lr)
        if self.batch > self.train_size:
            raise PolarizeError(f"`batch` must be at most `train-size`={self.train_size}; got {self.batch}")
        if not self.aux_weight >= 0 or self.aux_weight == float("inf"):  # NaN fails `>=`
            raise PolarizeError(f"`aux-weight` must be >= 0; got {self.aux_weight} (a finite number)")
        if self.record_every < 0:
            raise PolarizeError(f"`record-every` must be >= 0 (0: once per epoch); got {self.record_every}")
        if self.task == "induction" and not 0 <= self.sink_layer < min(self.layers):
            raise PolarizeError(
                f"`sink-layer` must be a layer index below every `layers` value "
                f"(min {min(self.layers)}); got {self.sink_layer}"
            )

    @property
    def steps(self) -> int:
        return self.epochs * (self.train_size // self.batch)

    def make_task(self) -> train.AbstractTask:
        if self.task == "induction":
            return train.Induction(shift_query=self.shift_query, aux_weight=self.aux_weight)
        return train.Classification(pairs=self.pairs)

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, stored: dict) -> "Config":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items() if k in fields})


# a toy budget (64 steps of 32 sequences, 2 seeds) that runs the whole pipeline in seconds
_SMALL = dict(
    layers=(2,), heads=(2,), lrs=(3e-3,), seeds=2, epochs=2, train_size=1024,
    batch=32, width=16, test_size=128, record_every=16, probe_size=64,
)  # fmt: skip
PRESETS: dict[str, dict[str, Config]] = {
    "induction": {
        # the paper's budget (10 x 100k sequences, batch 256: 3,900 steps) at width 32:
        # see the README for why this width and these heads
        "cpu": Config(
            preset="cpu",
            norms=("softmax", "sigmoid", "sigmoid-norm", "linear"),
            heads=(4,),
            width=32,
            seeds=3,
        ),
        "small": Config(preset="small", norms=("softmax", "sigmoid"), **_SMALL),
        # the paper's figure: aux 0.2, query shift on, positions add; 12 maps, 4 head counts,
        # 3 learning rates, 5 seeds, width 128 (a GPU job)
        "paper": Config(
            preset="paper", norms=PAPER_NORMS, heads=(1, 2, 4, 8), lrs=(1e-2, 1e-3, 1e-4), seeds=5
        ),
    },
    "classify": {
        "cpu": Config(
            task="classify",
            preset="cpu",
            norms=("softmax", "sigmoid", "sigmoid-norm", "elu-kernel", "linear"),
            layers=(1, 2),
            heads=(1, 4),
            lrs=(3e-3,),
            epochs=2,
            train_size=12800,
            width=64,
            positions="none",
            record_every=0,
        ),
        "small": Config(
            task="classify",
            preset="small",
            norms=("softmax", "sigmoid"),
            positions="none",
            pairs=64,
            **dict(_SMALL, layers=(1,)),
        ),  # fmt: skip
        "paper": Config(
            task="classify",
            preset="paper",
            norms=PAPER_NORMS,
            layers=(1, 2, 4),
            heads=(1, 2, 4, 8),
            seeds=5,
            positions="none",
            record_every=0,
        ),
    },
}


def make_config(task: str, preset: str = "cpu", **overrides) -> Config:
    """The preset's config with `overrides` (None = keep), validated."""
    check_choice("task", task, TASKS)
    base = PRESETS[task][check_choice("preset", preset, PRESETS[task])]
    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(base, **changes)


def versions() -> dict:
    names = ("jax", "jaxlib", "equinox", "optax", "numpy")
    return dict(python=sys.version.split()[0], **{n: importlib.metadata.version(n) for n in names})


def variants(config: Config) -> list[dict]:
    return [
        dict(norm=n, layers=la, heads=h, lr=lr)
        for n in config.norms
        for la in config.layers
        for h in config.heads
        for lr in config.lrs
    ]


def unit_name(v: dict, seed: int) -> str:
    return f"{v['norm']}_L{v['layers']}_H{v['heads']}_lr{v['lr']:g}_s{seed}"


def prepare(out: Path, config: Config, overwrite: bool) -> None:
    """Create `out`, resume it if it holds this config, refuse or clear it otherwise (the
    caller holds its lock). `overwrite` deletes only a lab run's own files (`_folder`)."""
    out = Path(out)
    stored = out / "config.json"
    names = [p.name for p in out.iterdir() if not p.name.startswith(".lock")]
    if names:
        try:
            same = stored.is_file() and _without_versions(read_json(stored)) == config.to_json()
        except (OSError, ValueError, UnicodeDecodeError):
            same = False
        if not same and not overwrite:
            raise _not_empty(out)
        if not same:
            prepare_out(out, overwrite=True, kind="lab")
    write_json(stored, dict(config.to_json(), versions=versions()))


def _not_empty(out: Path) -> PolarizeError:
    return PolarizeError(
        f"`--out` {out} is not empty and holds a different config (or none); "
        "pass --overwrite to replace it or choose another directory"
    )


def _without_versions(stored: dict) -> dict:
    return {k: v for k, v in stored.items() if k != "versions"}


def _make_models(keys, task, width: int, layers: int, heads: int, norm: str, positions: str):
    def make(key):
        return Transformer(
            task.vocab,
            task.out_vocab,
            width=width,
            layers=layers,
            heads=heads,
            norm=norm,
            causal=task.causal,
            positions=positions,
            key=key,
        )

    return train.stack_models(make, keys)


def init_models(keys, task, width: int, layers: int, heads: int, norm: str, positions: str) -> Transformer:
    """`Transformer`s for `keys[seeds]`, stacked, as `train.stack_models` makes them.

    A map without parameters or output gate (softmax, sigmoid, linear, ...) leaves the
    model's parameters what softmax's are from the same keys (the map is drawn from a key
    of its own): such models are softmax's with their map swapped in, so one compiled
    initialization serves them all.
    """
    args = (task, width, layers, heads)
    # traced, not run: a map with parameters shows them as shapes
    attend = eqx.filter_eval_shape(make_attention, norm, heads=heads, head_dim=width // heads, key=keys[0])
    if norm == "softmax" or attend.output_gate or jax.tree.leaves(eqx.filter(attend, _is_shape)):
        return _make_models_jit(keys, *args, norm, positions)
    models = _make_models_jit(keys, *args, "softmax", positions)
    return eqx.tree_at(lambda m: [b.attention.attend for b in m.blocks], models, [attend] * layers)


def _is_shape(x) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def _datasets(k_data, k_test, task, train_size: int, probe_size: int):
    data = jax.vmap(lambda k: task.data(k, train_size))(k_data)
    # a fixed probe set per seed, drawn apart from the training and test sets
    probe = jax.vmap(lambda k: task.data(jax.random.fold_in(k, 1), probe_size))(k_test)
    return data, probe


def _evaluate(models, keys, task, n: int):
    return eqx.filter_vmap(lambda m, k: task.evaluate(m, k, n))(models, keys)


def _unit_keys(seed: int, todo):
    """Run `s` uses `fold_in(key(seed), s)` alone, split for init, data, shuffling, test."""
    base = jax.random.key(seed)
    return jax.vmap(lambda s: jax.random.split(jax.random.fold_in(base, s), 4))(todo)


# compiled once per process and distinct static input: the data and the keys are shared by
# every variant, the models and the evaluation by every variant of one model structure
_make_models_jit = train.filter_jit(_make_models)
_datasets_jit = train.filter_jit(_datasets)
_evaluate_jit = train.filter_jit(_evaluate)
_unit_keys_jit = train.filter_jit(_unit_keys)


def train_variant(config: Config, v: dict, keys) -> list[dict]:
    """Train variant `v` for the seeds whose keys are `keys[seeds, 4]`; one result per seed."""
    task = config.make_task()
    k_init, k_data, k_shuffle, k_test = (keys[:, i] for i in range(4))
    models = init_models(k_init, task, config.width, v["layers"], v["heads"], v["norm"], config.positions)
    data, probe = _datasets_jit(k_data, k_test, task, config.train_size, config.probe_size)
    models, history = train.fit(
        models,
        task,
        data,
        k_shuffle,
        lr=v["lr"],
        epochs=config.epochs,
        batch=config.batch,
        weight_decay=config.weight_decay,
        record_every=config.record_every,
        probe_data=probe,
    )
    # per-seed slices in NumPy: an eager slice of a device array is one more compile
    metrics = jax.tree.map(np.asarray, _evaluate_jit(models, k_test, task, config.test_size))
    history = jax.tree.map(np.asarray, history)
    results = []
    for s in range(keys.shape[0]):
        result = {k: val[s] for k, val in metrics.items()}
        result.update({f"history_{k}": val[s] for k, val in history.items() if k != "step"})
        results.append(dict(result, history_step=history["step"]))
    return results


def run(config: Config, out, *, overwrite: bool = False, log: Callable = print) -> dict:
    """Train every unfinished (variant, seed) of `config` into `out`; return the summary."""
    out = Path(out)
    if out.is_dir() and folder_kind(out) != "lab":  # refused before a lock file is made in it
        if overwrite:
            check_out(out, overwrite, kind="lab")
        elif any(not p.name.startswith(".lock") for p in out.iterdir()):
            raise _not_empty(out)
    out = make_folder(out)
    with FolderLock(out):
        prepare(out, config, overwrite)
        return _train_all(config, out, log)


def _train_all(config: Config, out: Path, log: Callable) -> dict:
    for v in variants(config):
        todo = [s for s in range(config.seeds) if not (out / "units" / f"{unit_name(v, s)}.npz").exists()]
        if not todo:
            continue
        start, cpu = time.perf_counter(), time.process_time()
        keys = _unit_keys_jit(config.seed, np.asarray(todo, np.int32))
        for s, result in zip(todo, train_variant(config, v, keys)):
            arrays = {k: np.asarray(val) for k, val in result.items()}
            write_npz(out / "units" / f"{unit_name(v, s)}.npz", dict(arrays, seed=np.asarray(s)))
        log(
            f"{unit_name(v, 0)[:-3]}: {len(todo)} seeds x {config.steps} steps in "
            f"{time.perf_counter() - start:.1f}s wall, {time.process_time() - cpu:.1f}s CPU",
            flush=True,
        )
    summary = summarize(config, out)
    write_json(out / "summary.json", summary)
    figures.draw(config, summary, load_units(config, out), out)
    return summary


def load_units(config: Config, out: Path) -> list[dict]:
    units = []
    for v in variants(config):
        for s in range(config.seeds):
            path = Path(out) / "units" / f"{unit_name(v, s)}.npz"
            if path.exists():
                units.append({**read_npz(path), **v, "seed": s})
    return units


def bootstrap_interval(values, level: float = 0.9, resamples: int = 10_000, seed: int = 0) -> list[float]:
    """Percentile bootstrap interval of the mean of `values` (the runs are resampled)."""
    values = np.asarray(values, float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, (resamples, values.size))].mean(axis=1)
    tail = 100 * (1 - level) / 2
    return [float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))]


def run_sink_shares(config: Config, units: list[dict]) -> np.ndarray:
    """Per run: the share of layer `sink_layer`'s heads with sink score > SINK_HEAD."""
    return np.asarray([np.mean(u["sink_score"][config.sink_layer] > SINK_HEAD) for u in units])


def _induction_entry(config: Config, group: list[dict]) -> dict:
    ok = [u for u in group if u["accuracy"] > QUALIFY]
    layer = config.sink_layer
    entry: dict = dict(qualified=len(ok), sink_share=None, sink_share_90=None, sink_heads=0, heads_counted=0)
    if ok:
        shares = run_sink_shares(config, ok)
        scores = np.concatenate([u["sink_score"][layer].ravel() for u in ok])
        entry.update(
            sink_share=float(shares.mean()),
            sink_share_90=bootstrap_interval(shares),
            run_sink_shares=[float(x) for x in shares],
            sink_heads=int(np.sum(scores > SINK_HEAD)),
            heads_counted=int(scores.size),
            mean_sink_score=float(scores.mean()),
            # the same runs under other definitions: the lab's older score (|A| on key 0
            # averaged over all query rows 1..L-1) in the same layer, and the paper's
            # score in the other layers
            mean_bos_share_all_rows=float(np.mean([u["bos_share"][layer].mean() for u in ok])),
            sink_share_all_rows=float(np.mean([np.mean(u["bos_share"][layer] > SINK_HEAD) for u in ok])),
            sink_share_by_layer=[
                float(np.mean([np.mean(u["sink_score"][la] > SINK_HEAD) for u in ok]))
                for la in range(min(u["sink_score"].shape[0] for u in ok))
            ],
            gu_sink_share=float(np.mean(np.concatenate([u["alpha0"].ravel() for u in ok]) > sinks.SINK_EPS)),
        )
    steps = group[0]["history_step"]
    if "history_bos_score" in group[0]:
        curves = np.stack([np.mean(u["history_bos_score"][:, layer] > SINK_HEAD, axis=-1) for u in group])
        entry.update(
            emergence_steps=[int(x) for x in steps],
            emergence_sink_share=[float(x) for x in curves.mean(0)],
            emergence_accuracy=[float(x) for x in np.mean([u["history_accuracy"] for u in group], 0)],
        )
    return entry


def diverged_at(unit: dict) -> int | None:
    """The first recorded step whose mean training loss is not finite (the record at step
    0 has no loss yet, NaN by design), or None: a run that diverged has failed."""
    loss, steps = np.asarray(unit["history_loss"]), np.asarray(unit["history_step"])
    bad = ~np.isfinite(loss[1:])
    return int(steps[1:][np.argmax(bad)]) if bad.any() else None


def summarize(config: Config, out: Path) -> dict:
    """Per normalization (and per variant): run counts and the paper's metrics, over the
    runs that did not diverge; those are listed in `failed_runs` with their step."""
    units, failed = [], {}
    for u in load_units(config, out):
        step = diverged_at(u)
        if step is None:
            units.append(u)
        else:
            failed[unit_name(u, u["seed"])] = f"training loss not finite from step {step}"
    groups: dict = {"by_norm": {}, "by_variant": {}}
    for key, select in [("by_norm", lambda u: u["norm"]), ("by_variant", lambda u: unit_name(u, 0)[:-3])]:
        for name in dict.fromkeys(select(u) for u in units):
            group = [u for u in units if select(u) == name]
            norm = group[0]["norm"]
            entry = dict(
                normalized=make_attention(norm, heads=1, head_dim=2, key=jax.random.key(0)).normalized,
                runs=len(group),
                accuracy=float(np.mean([u["accuracy"] for u in group])),
                sparsity=float(np.mean([u["sparsity"].mean() for u in group])),
            )
            if config.task == "induction":
                entry.update(_induction_entry(config, group))
            else:
                entry.update(
                    flip_rate=float(np.mean([u["flip_rate"] for u in group])),
                    pairs=len(group) * config.pairs,
                )
            groups[key][name] = entry
    return dict(
        task=config.task,
        steps=config.steps,
        units=len(units) + len(failed),
        expected_units=len(variants(config)) * config.seeds,
        failed_runs=failed,
        **groups,
    )
