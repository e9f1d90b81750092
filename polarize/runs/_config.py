"""A sweep's settings: `SweepConfig`, its defaults, its checks and the names it accepts.

`SweepConfig` names everything that determines a sweep's numbers. Each family of
names is listed once (`MODELS`, `OBJECTIVES`, `SOLVERS`, `METHODS`, `TRAIN` here, the
normalizations in `core._choices`); the CLI lists the same names, and
`SweepConfig.build_objective()`, `.build_solver()`, `.build_model()` build the objects
the runner uses (`_build`, the one place a setting turns into an object; the solver
and `SolveOptions` in `_numerics`, with what a sweep measures).

Randomness: the target/data come from fold_in(key(seed), 2) and initialization i
from fold_in(fold_in(key(seed), 1), i), so every number is a function of
(config, i) alone, whatever the chunking.

This module imports no JAX: the CLI builds and validates a `SweepConfig` before JAX
is loaded (`polarize --help` and every bad argument answer in a fraction of JAX's
import time). The builders import the numerics on first use: `_build` (JAX), and
`_numerics` (diffrax, optax) only for the solver and `SolveOptions`, so that reading
a finished run never loads those. The registries of builders are in
`_build` and `_numerics`, and hold exactly the names listed here.
"""

import dataclasses

import numpy as np

from ..core._choices import (
    BLOCK_SIZE,
    LEVELS,
    LOSS_FRACTION,
    NORMALIZATION_NAMES,
    check_levels,
    time_names,
)
from ..core._errors import PolarizeError, check_choice, check_positive, check_type

#: model name -> what is trained (built by `_build.MODELS`).
MODELS = {
    "value": "the value-softmax model beta = V sigma(a), V(0) ~ v_scale N(0, 1), "
    "a(0) ~ a_offset + a_scale N(0, 1)",
    "prompt": "prompt attention f_i = v^T X_i^T sigma(X_i p) on random tokens X ~ N(0, 1) "
    "(samples x tokens x dim, samples default 4) with labels y = +-1 and v ~ N(0, I) "
    "(`prompt_task`); p(0) ~ p_scale N(0, I); objective logistic-data or square",
}
#: objective name -> what the sweep's target is (built by `_build.OBJECTIVES`).
OBJECTIVES = {
    "logistic": "logistic loss toward a random unit direction",
    "logistic-data": "logistic loss on random labelled data (samples, default 4 d; "
    "model prompt: the logistic loss of its labels, samples default 4)",
    "square": "square loss on a regression with condition number kappa (model prompt: "
    "the square loss of its labels)",
    "cross-entropy": "cross-entropy toward a peaked distribution",
}
#: The objectives of model prompt (their label losses: `_build.PROMPT_OBJECTIVES`).
PROMPT_OBJECTIVES = ("logistic-data", "square")
#: What model prompt trains: p alone (v fixed at the task's v), or v and p, v(0) ~ v_scale N(0, I).
TRAIN = {"p": "p only, v fixed (the max-margin theorems' setting)", "vp": "v and p jointly"}
#: solver names; "auto" is `flow`'s default (stiff objectives get the Rosenbrock-W
#: method of `polarize.solve._stiff`, the rest Tsit5); the others are diffrax's.
SOLVERS = ("auto", "tsit5", "dopri5", "kvaerno5")
#: method name -> what it integrates.
METHODS = {"flow": "exact gradient flow (diffrax)", "gd": "plain gradient descent at lr (optax.sgd)"}
#: objectives with a logistic tail, where `rate_C` is fitted.
LOGISTIC = ("logistic", "logistic-data")
#: `chunk_size` and `block_size` where a config leaves them at None, by JAX's default
#: backend. On CPU: chunks of 6 runs of `_sweep.AT_ONCE_CPU` blocks (none padded on 1,
#: 2, 3 or 6 threads), blocks of `BLOCK_SIZE`. On a GPU or TPU an adaptive loop's step costs about
#: the same for 128 initializations as for 16,384, so blocks are wide, solved one per
#: device at a time, and chunks hold several (measured on an H200: benchmarks/GPU.md).
SIZES = {"cpu": {"chunk_size": 12_288, "block_size": BLOCK_SIZE}}
ACCELERATOR_SIZES = {"chunk_size": 131_072, "block_size": 16_384}


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """Everything that determines a sweep's numbers (defaults: the paper's logistic toy)."""

    model: str = "value"
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
    solver: str = "auto"
    max_steps: int = 100_000
    lr: float = 0.1
    steps: int = 10_000
    v_scale: float = 0.1
    a_scale: float = 0.0
    a_offset: float = 0.0
    train: str = "p"
    p_scale: float = 0.3
    seed: int = 0
    n_save: int = 64
    snapshots: int = 32
    threshold: float = 0.9
    levels: tuple[float, ...] = LEVELS
    loss_fraction: float = LOSS_FRACTION
    chunk_size: int | None = None  # None: by backend (`SIZES`); never changes the numbers
    block_size: int | None = None  # None: by backend (`SIZES`); part of the numbers' bit-identity

    def __post_init__(self):
        # strict types first: a bool is not an integer, 8.0 is not one, "8" is not a number
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "levels" or (value is None and field.default is None):
                continue
            kind = _KINDS.get(field.type, "number")
            check_type(field.name, value, kind)
            if kind != "string":  # 300 and 300.0 are one setting (and one settings hash)
                object.__setattr__(self, field.name, (int if kind == "integer" else float)(value))
        if not -(2**63) <= self.seed < 2**63:
            raise PolarizeError(f"`seed` must be a 64-bit integer, |seed| < 2**63; got {self.seed}")
        if self.n_save < 2:
            raise PolarizeError(f"`n_save` must be >= 2 (the first and last saved times); got {self.n_save}")
        check_choice("model", self.model, MODELS)
        check_choice("objective", self.objective, OBJECTIVES)
        if self.model == "prompt" and self.objective not in PROMPT_OBJECTIVES:
            raise PolarizeError(
                f"`objective` {self.objective} does not apply to model prompt; "
                f"valid: {', '.join(PROMPT_OBJECTIVES)}"
            )
        check_choice("train", self.train, TRAIN)
        check_choice("norm", self.norm, NORMALIZATION_NAMES)
        check_choice("method", self.method, METHODS)
        check_choice("solver", self.solver, SOLVERS)
        ints = ("tokens", "dim", "inits", "steps", "max_steps", "n_save", "snapshots")
        for name in ints:
            check_positive(name, getattr(self, name), integer=True)
        for name in ("samples", "chunk_size", "block_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name), integer=True)
        for name in ("t1", "rtol", "atol", "lr", "temperature", "kappa"):
            check_positive(name, getattr(self, name))
        for name in ("v_scale", "a_scale", "a_offset", "p_scale", "sink", "threshold"):
            value = getattr(self, name)
            if not np.isfinite(value):
                raise PolarizeError(f"`{name}` must be finite; got {value!r}")
        for name in ("v_scale", "a_scale", "p_scale"):  # standard deviations of the draws
            if getattr(self, name) < 0:
                raise PolarizeError(
                    f"`{name}` must be >= 0 (a standard deviation); got {getattr(self, name)!r}"
                )
        if self.kappa < 1:
            raise PolarizeError(f"`kappa` must be >= 1; got {self.kappa!r}")
        if not 0 < self.threshold <= 1:
            raise PolarizeError(f"`threshold` must be in (0, 1]; got {self.threshold!r}")
        if not 0 < self.loss_fraction < 1:
            raise PolarizeError(f"`loss_fraction` must be in (0, 1); got {self.loss_fraction!r}")
        object.__setattr__(self, "levels", check_levels(self.levels))

    def not_applicable(self, names) -> list[tuple[str, str]]:
        """Of the settings `names` (given by a user), those this config does not use, each
        with where it applies: [("temperature", "only for norm softmax"), ...]."""
        out = []
        for name in names:
            alternatives = _APPLIES_EITHER.get(name, (_APPLIES.get(name, ()),))
            if not any(all(getattr(self, s) in values for s, values in rules) for rules in alternatives):
                where = ", or ".join(
                    " and ".join(f"{setting} {' or '.join(values)}" for setting, values in rules)
                    for rules in alternatives
                )
                out.append((name, f"only for {where}"))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "SweepConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise PolarizeError(f"unknown sweep setting(s) {unknown}; valid: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "levels": list(self.levels)}

    def resolved(self) -> "SweepConfig":
        """This config with `chunk_size` and `block_size` left at None set for JAX's default
        backend (`SIZES`): what a sweep stores in config.json, so a resumed run (on any
        backend) keeps the blocks its numbers were computed in."""
        import jax  # the first use of JAX: see the module doc

        sizes = SIZES.get(jax.default_backend(), ACCELERATOR_SIZES)
        return dataclasses.replace(self, **{k: getattr(self, k) or v for k, v in sizes.items()})

    # -- the objects a sweep is made of (`_build`, imported on first use) ---------------

    def build_norm(self):
        """The `AbstractNormalization` of `norm`, with its temperature or sink."""
        return _builders().norm(self)

    def build_objective(self):
        """The sweep's target, an `AbstractObjective` shared by every initialization, from
        fold_in(key(seed), 2)."""
        return _builders().objective(self)

    def build_solver(self):
        """The diffrax solver, or None for `flow`'s default."""
        return _numerics().solver(self)

    def build_model(self, start: int, stop: int):
        """Initializations start .. stop - 1 (each from (seed, i) alone): a `ValueAttention`,
        or a `PromptAttention` on the sweep's tokens for model prompt."""
        return _builders().model(self, start, stop)

    # -- what a sweep stores -------------------------------------------------------------

    def times(self) -> np.ndarray:
        """The saved times of every trajectory of the sweep (steps x lr for descent)."""
        return _builders().times(self)

    def solve_options(self):
        """The flow's settings of this sweep (its block size resolved): the one place a
        config turns into `SolveOptions`, with its hitting-time targets."""
        return _numerics().solve_options(self)

    def program(self) -> "SweepConfig":
        """This config (its block size resolved) with its `DATA_ONLY` settings at their
        defaults: the key of the programs that solve and measure its pieces."""
        defaults = SweepConfig()
        return dataclasses.replace(self.resolved(), **{name: getattr(defaults, name) for name in DATA_ONLY})

    def horizon(self) -> float:
        return self.t1 if self.method == "flow" else self.steps * self.lr

    def snapshot_index(self) -> np.ndarray:
        """Indices into `times()` of the kept snapshots (about `snapshots`, log-spaced)."""
        n = len(self.times())
        return np.unique(np.round(np.linspace(0, n - 1, min(self.snapshots, n))).astype(int))

    def time_names(self) -> list[str]:
        """Names of the stored hitting times (`time_to_0.9`, ..., `time_to_loss_0.001`)."""
        return time_names(self.levels, self.loss_fraction)

    def fits_rate(self) -> bool:
        """Whether `rate_C` is fitted: the value model under a logistic objective (prompt
        attention's tails fall like a power of t, not like (log t)^-2)."""
        return self.model == "value" and self.objective in LOGISTIC

    def data_samples(self) -> int | None:
        """The samples of the sweep's data: `samples`, or its default (None: no data)."""
        if self.model == "prompt":
            return self.samples or PROMPT_SAMPLES
        return self.samples or {"logistic-data": 4 * self.dim, "square": self.dim}.get(self.objective)


#: a field's annotation -> the kind `check_type` checks (anything else: "number")
_KINDS = {str: "string", int: "integer", int | None: "integer"}
#: setting -> the (setting, values where it is used) it depends on, all of them
_APPLIES = {
    "temperature": (("norm", ("softmax",)),),
    "sink": (("norm", ("softmax1",)),),
    "kappa": (("objective", ("square",)), ("model", ("value",))),
    "samples": (("objective", ("logistic-data", "square")),),
    **{name: (("method", ("flow",)),) for name in ("t1", "rtol", "atol", "solver", "max_steps")},
    **{name: (("method", ("gd",)),) for name in ("lr", "steps")},
    **{name: (("model", ("value",)),) for name in ("a_scale", "a_offset")},
    **{name: (("model", ("prompt",)),) for name in ("train", "p_scale")},
}
#: settings used under any one of several such conditions
_APPLIES_EITHER = {"v_scale": ((("model", ("value",)),), (("model", ("prompt",)), ("train", ("vp",))))}
#: Settings that only choose the numbers a sweep starts from (its initializations and
#: data) or what is made of its results afterwards, never the program that solves and
#: measures a piece: `SweepConfig.program` resets them, so that cells of a study that
#: differ only in these (a grid over kappa, v_scale or seed) share one compiled program.
DATA_ONLY = ("kappa", "v_scale", "a_scale", "a_offset", "p_scale", "seed", "inits", "chunk_size", "threshold")
#: Samples of model prompt where `samples` is None (the issue's probe: n = 4, T = 5, d = 6).
PROMPT_SAMPLES = 4
#: Settings added after sweeps were first stored, at the values every earlier sweep had:
#: the settings hash (`_folder.settings_hash`) leaves them out where they hold these, so
#: the chunks of a folder stored before them still resume.
LATER_SETTINGS = {"model": "value", "train": "p", "p_scale": 0.3}


def _builders():
    """The module that builds a config's objects (`_build`): imported on first use (see
    the module doc)."""
    from . import _build

    return _build


def _numerics():
    """The module of a config's solver and `SolveOptions` (`_numerics`: diffrax, optax),
    imported on first use (see the module doc)."""
    from . import _numerics

    return _numerics
