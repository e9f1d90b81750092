"""The main job: a Monte-Carlo study of polarization over many initializations.

A `SweepConfig` names everything (objective, normalization, sizes, method, seed);
`run_sweep` runs it in chunks of initializations and writes config.json,
summary.json, per-initialization arrays (.npz) and weights.png into a folder.

Randomness: the target/data come from fold_in(key(seed), 2) and initialization i
from fold_in(fold_in(key(seed), 1), i), so every number is a function of
(config, i) alone, whatever the chunking.
"""

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np

from .descent import descend
from .errors import PolarizeError, check_choice, check_positive
from .flow import flow
from .models import as_key, init_ensemble
from .normalizations import NORMALIZATIONS, normalization
from .objectives import (
    AbstractObjective,
    conditioned_regression,
    peaked_distribution,
    random_direction,
    random_labels,
)
from .statistics import aggregate, order_statistics, series
from .storage import read_json, write_json, write_npz

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
    threshold: float = 0.9
    chunk_size: int = 10_000

    def __post_init__(self):
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("norm", self.norm, NORMALIZATIONS)
        check_choice("method", self.method, METHODS)
        check_choice("solver", self.solver, SOLVERS)
        for name in ("tokens", "dim", "inits", "steps", "n_save", "chunk_size"):
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


def run_chunk(config: SweepConfig, start: int, stop: int) -> dict[str, np.ndarray]:
    """Per-initialization results for initializations start .. stop - 1.

    Returns final statistics (`final_*`, shape (n,)), the status flags, the value
    projections at t = 0 where defined, and the series (`series_*`, (n, times)).
    """
    objective = build_objective(config)
    model = init_ensemble(
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
    if config.method == "flow":
        traj = flow(
            model,
            objective,
            t1=config.t1,
            n_save=config.n_save,
            rtol=config.rtol,
            atol=config.atol,
            solver=_solver(config.solver),
        )
    else:
        traj = descend(model, objective, config.lr, steps=config.steps, n_save=config.n_save)
    out = {"ts": np.asarray(traj.ts), "ok": np.asarray(traj.ok), "status": np.asarray(traj.status)}
    for name, value in series(traj).items():
        out[f"series_{name}"] = np.asarray(value)
        out[f"final_{name}"] = np.asarray(value)[:, -1]
    for name, value in order_statistics(traj, objective).items():
        out[f"final_{name}"] = np.asarray(value)
    if config.method == "flow":
        out["solver_steps"] = np.asarray(traj.steps)
    return out


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
        raise PolarizeError(f"`--out` {out} is not empty; pass --overwrite or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_sweep(config: SweepConfig, out, *, overwrite: bool = False) -> dict:
    """Run a sweep and write its folder; returns the summary (also in summary.json)."""
    from .plots import plot_bands

    out = prepare_out(out, overwrite)
    write_json(out / "config.json", {"sweep": config.to_dict(), "versions": package_versions()})
    start_time = time.perf_counter()
    parts = [run_chunk(config, a, b) for a, b in chunks(config.inits, config.chunk_size)]
    arrays = {k: v if k == "ts" else np.concatenate([p[k] for p in parts]) for k, v in parts[0].items()}
    wall = time.perf_counter() - start_time
    summary = summary_of(config, arrays)
    summary["wall_seconds"] = round(wall, 3)
    write_npz(out / "per_init.npz", {k: v for k, v in arrays.items() if not k.startswith("series_")})
    write_npz(out / "series.npz", {k: v for k, v in arrays.items() if k.startswith("series_") or k == "ts"})
    write_json(out / "summary.json", summary)
    plot_bands(arrays, config, out / "weights.png")
    return summary


def load(out) -> dict:
    """A finished sweep folder: {"config", "summary", "arrays"} without recomputing."""
    from .storage import read_npz

    out = Path(out)
    arrays = read_npz(out / "per_init.npz")
    arrays.update(read_npz(out / "series.npz"))
    return {
        "config": SweepConfig.from_dict(read_json(out / "config.json")["sweep"]),
        "summary": read_json(out / "summary.json"),
        "arrays": arrays,
    }


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
