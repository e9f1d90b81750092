"""The main job: a Monte-Carlo study of polarization over many initializations.

A `SweepConfig` names everything (objective, normalization, sizes, method, seed);
`run_sweep` runs it in chunks of initializations, each written to disk as soon as
it is finished (`polarize.store`), and then assembles config.json, summary.json,
per-initialization arrays (.npz) and figures into the folder. An interrupted run
continues with `resume=True` (`polarize sweep --resume DIR`), recomputing only
missing or damaged chunks; the result is bit-identical to an uninterrupted run.

Per initialization only reduced quantities are kept: final statistics (float64)
and `snapshots` log-spaced values of max weight and entropy (float32). Full
trajectories are kept for the first `sample` initializations (sample.npz).

Randomness: the target/data come from fold_in(key(seed), 2) and initialization i
from fold_in(fold_in(key(seed), 1), i), so every number is a function of
(config, i) alone, whatever the chunking.
"""

import dataclasses
import time
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from .descent import descend, save_steps
from .devices import barrier, my_chunks, over_devices
from .ensembles import blockwise
from .errors import PolarizeError, check_choice, check_positive
from .flow import flow, save_times
from .models import as_key, init_ensemble
from .normalizations import NORMALIZATIONS, normalization
from .objectives import (
    AbstractObjective,
    conditioned_regression,
    peaked_distribution,
    random_direction,
    random_labels,
)
from .statistics import aggregate, order_statistics, top_singular_share, weight_series
from .storage import read_json, read_npz, write_json, write_npz
from .store import ChunkStore
from .trajectory import Trajectory

OBJECTIVES = ("logistic", "logistic-data", "square", "cross-entropy")
METHODS = ("flow", "gd")
SOLVERS = ("tsit5", "dopri5", "kvaerno5")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """Everything that determines a sweep's numbers (defaults: the paper's logistic toy)."""

    objective: str = "logistic"
    norm: str = "softmax"
    temperature: float = 1.0
    sink: float = 0.0
    tokens: int = 8
    dim: int = 8
    samples: int | None = None
    kappa: float = 1.0
    inits: int = 1000
    method: str = "flow"
    t1: float = 1e5
    rtol: float = 1e-6
    atol: float = 1e-8
    solver: str = "tsit5"
    lr: float = 0.1
    steps: int = 10_000
    v_scale: float = 0.1
    a_scale: float = 0.0
    a_offset: float = 0.0
    seed: int = 0
    n_save: int = 64
    snapshots: int = 32
    threshold: float = 0.9
    chunk_size: int = 10_000

    def __post_init__(self):
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("norm", self.norm, NORMALIZATIONS)
        check_choice("method", self.method, METHODS)
        check_choice("solver", self.solver, SOLVERS)
        for name in ("tokens", "dim", "inits", "steps", "n_save", "snapshots", "chunk_size"):
            check_positive(name, getattr(self, name), integer=True)
        if self.samples is not None:
            check_positive("samples", self.samples, integer=True)
        for name in ("t1", "rtol", "atol", "lr", "temperature", "kappa"):
            check_positive(name, getattr(self, name))
        for name in ("v_scale", "a_scale", "a_offset", "sink", "threshold"):
            value = getattr(self, name)
            if not np.isfinite(value):
                raise PolarizeError(f"`{name}` must be finite; got {value!r}")
        if self.kappa < 1:
            raise PolarizeError(f"`kappa` must be >= 1; got {self.kappa!r}")
        if not 0 < self.threshold <= 1:
            raise PolarizeError(f"`threshold` must be in (0, 1]; got {self.threshold!r}")
        if self.objective in ("logistic", "cross-entropy") and self.tokens < 1:
            raise PolarizeError("`tokens` must be positive")

    @classmethod
    def from_dict(cls, d: dict) -> "SweepConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise PolarizeError(f"unknown sweep setting(s) {unknown}; valid: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_norm(config: SweepConfig):
    options = {}
    if config.norm == "softmax":
        options["temperature"] = config.temperature
    if config.norm == "softmax1":
        options["sink"] = config.sink
    return normalization(config.norm, **options)


def build_objective(config: SweepConfig) -> AbstractObjective:
    """The sweep's target, shared by every initialization, from fold_in(key(seed), 2)."""
    key = jax.random.fold_in(as_key(config.seed), 2)
    if config.objective == "logistic":
        return random_direction(key, config.dim)
    if config.objective == "logistic-data":
        return random_labels(key, config.samples or 4 * config.dim, config.dim)
    if config.objective == "square":
        return conditioned_regression(key, config.samples or config.dim, config.dim, config.kappa)
    return peaked_distribution(key, config.dim)


def _solver(name: str):
    import diffrax

    return {"tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5, "kvaerno5": diffrax.Kvaerno5}[name]()


def _model(config: SweepConfig, start: int, stop: int):
    return init_ensemble(
        jax.random.fold_in(as_key(config.seed), 1),
        stop - start,
        tokens=config.tokens,
        dim=config.dim,
        v_scale=config.v_scale,
        a_scale=config.a_scale,
        a_offset=config.a_offset,
        norm=build_norm(config),
        start=start,
    )


def _trajectory(config: SweepConfig, model, objective):
    if config.method == "flow":
        return flow(
            model,
            objective,
            t1=config.t1,
            n_save=config.n_save,
            rtol=config.rtol,
            atol=config.atol,
            solver=_solver(config.solver),
        )
    return descend(model, objective, config.lr, steps=config.steps, n_save=config.n_save)


def times(config: SweepConfig) -> np.ndarray:
    """The saved times of every trajectory of the sweep."""
    if config.method == "flow":
        return save_times(config.t1, config.n_save)
    return save_steps(config.steps, config.n_save) * config.lr


def snapshot_index(config: SweepConfig) -> np.ndarray:
    """Indices into `times(config)` of the kept snapshots (about `snapshots`, log-spaced)."""
    n = len(times(config))
    return np.unique(np.round(np.linspace(0, n - 1, min(config.snapshots, n))).astype(int))


def run_chunk(config: SweepConfig, start: int, stop: int, *, devices=None) -> dict[str, np.ndarray]:
    """Per-initialization results for initializations start .. stop - 1, over all local devices.

    Returns `final_*` statistics (float64, shape (n,)), `ok`, `status`, the solver's
    step counts (flow), and `snap_max_weight`, `snap_entropy` at the snapshot times
    (float32, shape (n, snapshots)).
    """
    objective = build_objective(config)
    keep = snapshot_index(config)

    def solve(model, objective):
        traj = _trajectory(config, model, objective)
        return {
            "V": traj.V,
            "a": traj.a,
            "weights": traj.weights,
            "loss": traj.loss,
            "ok": traj.ok,
            "status": traj.status,
            "steps": traj.steps,
        }

    # The solves (the expensive part) are split over devices; the statistics run
    # after them on one device (LAPACK calls on several host devices at once can stall).
    traj = over_devices(solve, _model(config, start, stop), objective, devices)
    out = _statistics(
        objective, jax.numpy.asarray(times(config)), keep, traj["V"], traj["a"], traj["weights"], traj["loss"]
    )
    out["ok"], out["status"] = traj["ok"], traj["status"]
    if config.method == "flow":
        out["solver_steps"] = traj["steps"]
    return {k: np.asarray(v) for k, v in out.items()}


@eqx.filter_jit
def _statistics(objective, ts, keep, V, a, weights, loss):
    def stats(arrays):
        # per initialization inside the fixed-block program, like the flow itself,
        # so these numbers too are bit-identical for any chunking
        V, a, weights, loss = arrays
        one = Trajectory(
            ts=ts,
            V=V,
            a=a,
            weights=weights,
            loss=loss,
            ok=jax.numpy.asarray(True),
            status=jax.numpy.asarray(0),
        )
        snaps = weight_series(weights[keep])  # keep ends with the final time
        out = {f"final_{k}": v[-1] for k, v in snaps.items()}
        out["final_top_share"] = top_singular_share(V[-1])  # one SVD, not one per saved time
        out["final_loss"] = loss[-1]
        out.update({f"final_{k}": v for k, v in order_statistics(one, objective).items()})
        out["snap_max_weight"] = snaps["max_weight"].astype(jax.numpy.float32)
        out["snap_entropy"] = snaps["entropy"].astype(jax.numpy.float32)
        return out

    return blockwise(stats, (V, a, weights, loss))


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[(start, stop), ...] covering range(n) in pieces of at most `size`."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def summary_of(config: SweepConfig, arrays: dict) -> dict:
    """summary.json content from the per-initialization arrays of a whole sweep."""
    final = {k.removeprefix("final_"): v for k, v in arrays.items() if k.startswith("final_")}
    final["ok"] = arrays["ok"]
    return aggregate(final, config.threshold)


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("polarize", "jax", "jaxlib", "equinox", "diffrax", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def prepare_out(out: Path, overwrite: bool) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`--out` {out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise PolarizeError(
            f"`--out` {out} is not empty; pass --resume {out} to continue it, "
            "--overwrite to replace it, or choose another folder"
        )
    if out.exists() and overwrite:
        import shutil

        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def stored_config(out) -> SweepConfig:
    """The config a run folder was started with (refuses a folder that is not a sweep)."""
    path = Path(out) / "config.json"
    if not path.exists():
        raise PolarizeError(f"`--resume` {out} has no config.json: not a polarize sweep folder")
    return SweepConfig.from_dict(read_json(path)["sweep"])


def check_same(stored: SweepConfig, requested: SweepConfig, out) -> None:
    """Refuse to resume `out` with a config other than the one it was started with."""
    a, b = stored.to_dict(), requested.to_dict()
    diff = [f"{k}={a[k]!r} (requested {b[k]!r})" for k in a if a[k] != b[k]]
    if diff:
        raise PolarizeError(
            f"`--resume` {out} was run with a different config: {', '.join(diff)}; "
            "resume with the stored settings or start a new --out"
        )


_REQUIRED = ("ok", "status", "final_max_weight", "final_entropy", "snap_max_weight", "start", "stop")


def run_sweep(
    config: SweepConfig,
    out,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
    sample: int = 0,
    devices=None,
) -> dict:
    """Run (or resume) a sweep in `out`; returns the summary (also in summary.json).

    Finished chunks are on disk as soon as they are done, so an interrupted run
    loses at most the chunk in flight. With several JAX processes
    (`jax.distributed.initialize()` first), each computes its share of chunks and
    process 0 assembles the results.
    """
    if sample < 0:
        raise PolarizeError(f"`sample` must be >= 0; got {sample}")
    jax.config.update("jax_enable_x64", True)  # sweeps are float64 throughout
    out = Path(out)
    if resume:
        check_same(stored_config(out), config, out)
    elif jax.process_index() == 0:
        prepare_out(out, overwrite)
        write_json(out / "config.json", {"sweep": config.to_dict(), "versions": package_versions()})
    barrier("polarize-sweep-start")
    ranges = chunks(config.inits, config.chunk_size)
    store = ChunkStore(out, ranges, _REQUIRED)
    todo = [i for i in my_chunks(len(ranges)) if not store.done(i)]
    started = time.perf_counter()
    bar = _progress(progress, ranges, todo)
    for i in todo:
        store.write(i, run_chunk(config, *ranges[i], devices=devices))
        if bar is not None:
            bar.update(ranges[i][1] - ranges[i][0])
    if bar is not None:
        bar.close()
    barrier("polarize-sweep-chunks")
    if jax.process_index() != 0:
        return {}
    return assemble(config, out, store, sample=sample, wall=time.perf_counter() - started)


def _progress(enabled: bool, ranges, todo):
    if not enabled:
        return None
    from tqdm import tqdm

    total = sum(b - a for a, b in ranges)
    remaining = sum(ranges[i][1] - ranges[i][0] for i in todo)
    return tqdm(
        total=total, initial=total - remaining, unit="init", unit_scale=True, desc="sweep", smoothing=0.1
    )


def assemble(config: SweepConfig, out: Path, store: ChunkStore, *, sample: int, wall: float) -> dict:
    """Concatenate the chunks into per_init.npz/series.npz, write summary.json and figures."""
    from .plots import sweep_figures

    parts = []
    for i in range(len(store.ranges)):
        part = store.read(i)
        if part is None:  # another process's chunk went missing: compute it here
            part = run_chunk(config, *store.ranges[i])
            store.write(i, part)
        parts.append(part)
    keys = [k for k in parts[0] if k not in ("start", "stop")]
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in keys}
    ts = times(config)
    arrays["ts"] = ts
    summary = summary_of(config, arrays)
    summary["wall_seconds"] = round(wall, 3)
    write_npz(out / "per_init.npz", {k: v for k, v in arrays.items() if not k.startswith("snap_")})
    snaps = {k: v for k, v in arrays.items() if k.startswith("snap_")}
    write_npz(out / "series.npz", {**snaps, "ts": ts[snapshot_index(config)], "ok": arrays["ok"]})
    if sample:
        n = min(sample, config.inits)
        traj = _trajectory(config, _model(config, 0, n), build_objective(config))
        write_npz(
            out / "sample.npz",
            {
                "ts": traj.ts,
                "V": traj.V,
                "a": traj.a,
                "weights": traj.weights,
                "loss": traj.loss,
                "ok": traj.ok,
            },
        )
    write_json(out / "summary.json", summary)
    sweep_figures(load_arrays(out), config, out)
    return summary


def load_arrays(out) -> dict:
    """Per-initialization arrays of a finished sweep folder (snapshots as `series_*`)."""
    out = Path(out)
    arrays = read_npz(out / "per_init.npz")
    snaps = read_npz(out / "series.npz")
    arrays["snap_ts"] = snaps["ts"]
    arrays.update({"series_" + k.removeprefix("snap_"): v for k, v in snaps.items() if k.startswith("snap_")})
    return arrays


def load(out) -> dict:
    """A finished sweep folder: {"config", "summary", "arrays"} without recomputing anything."""
    out = Path(out)
    if not (out / "summary.json").exists():
        raise PolarizeError(f"{out} holds no finished sweep (no summary.json); resume it first")
    result = {
        "config": stored_config(out),
        "summary": read_json(out / "summary.json"),
        "arrays": load_arrays(out),
    }
    if (out / "sample.npz").exists():
        result["sample"] = read_npz(out / "sample.npz")
    return result


def result_line(config: SweepConfig, summary: dict) -> str:
    """The one line the CLI prints."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def num(x):
        return "n/a" if x is None else f"{x:.3g}"

    horizon = f"t={config.t1:.3g}" if config.method == "flow" else f"{config.steps} steps lr={config.lr:g}"
    return (
        f"{config.norm}/{config.objective} {config.method} to {horizon}: "
        f"{summary['n_inits']} inits, {summary['n_failed']} failed | "
        f"one-hot(>={config.threshold:g}) {pct(summary['one_hot_fraction'])}, "
        f"median max weight {num(summary['median_max_weight'])}, "
        f"median entropy {num(summary['median_entropy'])}, "
        f"order preserved {pct(summary['order_preserved_fraction'])}, "
        f"winner=argmax u0 {pct(summary['winner_is_argmax_u0_fraction'])} "
        f"[{summary.get('wall_seconds', float('nan')):.1f} s]"
    )
