"""The objects a sweep is made of, built from its `SweepConfig`: the one place where
a sweep's strings become objects.

`SweepConfig`'s builders (`build_objective`, `build_model`, ...) call these; the
config itself imports no JAX, so this module is imported on their first use (and
imports nothing of the config: the registries' names are checked against the
config's in tests/runs/test_config.py).
"""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..core._host_draws import host_cheaper, host_drawable, host_normal, host_normals, host_seed, host_stream
from ..core._models import (
    AbstractModel,
    ValueAttention,
    first_index,
    init_ensemble,
    scaled_ensemble,
    standard_normals,
)
from ..core._normalizations import AbstractNormalization, normalization
from ..core._objectives import (
    AbstractObjective,
    LogisticDirection,
    Square,
    conditioned_regression,
    peaked_distribution,
    random_direction,
    random_labels,
    regression_data,
)
from ..core._prompt import LogisticLabels, SquareLabels, init_prompts, prompt_task
from ..core._times import save_steps, save_times
from ..solve._devices import stored_programs_dir
from ._programs import StoredProgram

#: objective name -> builder(key, config): the sweep's target, shared by every initialization.
OBJECTIVES = {
    "logistic": lambda key, c: random_direction(key, c.dim),
    "logistic-data": lambda key, c: random_labels(key, c.samples or 4 * c.dim, c.dim),
    "square": lambda key, c: conditioned_regression(key, c.samples or c.dim, c.dim, c.kappa),
    "cross-entropy": lambda key, c: peaked_distribution(key, c.dim),
}
#: objective name of model prompt -> its label loss, built from the task's labels y.
PROMPT_OBJECTIVES = {"logistic-data": LogisticLabels, "square": SquareLabels}


def stream(seed: int, i: int):
    """fold_in(key(seed), i): the key of a sweep's data (i = 2) or of its initializations
    (i = 1, each then folded in with its index)."""
    return _stream(np.int64(seed), np.uint32(i))


@jax.jit
def _stream(seed, i):  # one program for every seed and stream (op by op: four, ~25 ms each)
    return jax.random.fold_in(jax.random.key(seed), i)


# -- the draws as stored programs ---------------------------------------------------------
# Where the compilation cache is on (the CLI), a sweep's random draws run as stored
# exported programs (`_programs`): lowering threefry and the normal draw was most of the
# ~0.45 s a warm sweep spent building its model and objective. The same functions, so
# the same bits as `init_ensemble` and `random_direction` (tests/runs/test_programs.py).


def _normals(config, start: int, n: int) -> tuple:
    """`init_ensemble`'s standard normals of initializations start .. start + n - 1: hashed
    on the host where that is cheaper (`core._host_draws`), else a stored program."""
    start = first_index(start, n)
    dtype, shape = str(jnp.result_type(float)), (config.dim, config.tokens)
    if host_seed(config.seed) and host_drawable(None, start, n, shape, dtype):
        return host_normals(host_stream(config.seed, 1), start, n=n, shape=shape, dtype=dtype)
    return _normals_program(n, config.tokens, config.dim, dtype, stored_programs_dir())(
        np.asarray(config.seed, np.int64), np.asarray(start, np.uint32)
    )


@functools.lru_cache(maxsize=8)
def _normals_program(n: int, tokens: int, dim: int, dtype: str, folder: Path) -> StoredProgram:
    def draw(seed, start):
        return standard_normals(_stream(seed, np.uint32(1)), start, n=n, shape=(dim, tokens), dtype=dtype)

    settings = {"n": n, "tokens": tokens, "dim": dim, "dtype": dtype}
    return StoredProgram(lambda *_: draw, "runs._build.normals", settings, folder)


def _direction(config) -> LogisticDirection:
    """`OBJECTIVES["logistic"]`: `random_direction(stream(seed, 2), dim)`."""
    if host_seed(config.seed) and host_cheaper(config.dim, jnp.result_type(float)):
        return LogisticDirection(
            host_normal(host_stream(config.seed, 2), (config.dim,), jnp.result_type(float))
        )
    return LogisticDirection(
        _direction_program(config.dim, stored_programs_dir())(np.asarray(config.seed, np.int64))
    )


@functools.lru_cache(maxsize=8)
def _direction_program(dim: int, folder: Path) -> StoredProgram:
    draw = lambda seed: jax.random.normal(_stream(seed, np.uint32(2)), (dim,))
    return StoredProgram(lambda *_: draw, "runs._build.direction", {"dim": dim}, folder)


def _regression(config) -> Square:
    """`OBJECTIVES["square"]`: `conditioned_regression(stream(seed, 2), samples, dim, kappa)`
    (op by op, its lowering and a dozen small programs were ~0.3 s of a warm study's first
    cell; here kappa is an argument, so a grid over kappa runs one program)."""
    program = _regression_program(config.samples or config.dim, config.dim, stored_programs_dir())
    return Square(*program(np.asarray(config.seed, np.int64), np.asarray(config.kappa, np.float64)))


@functools.lru_cache(maxsize=8)
def _regression_program(n: int, dim: int, folder: Path) -> StoredProgram:
    draw = lambda seed, kappa: regression_data(_stream(seed, np.uint32(2)), n, dim, kappa)
    return StoredProgram(lambda *_: draw, "runs._build.regression", {"n": n, "dim": dim}, folder)


def norm(config) -> AbstractNormalization:
    options = {"softmax": {"temperature": config.temperature}, "softmax1": {"sink": config.sink}}
    return normalization(config.norm, **options.get(config.norm, {}))


def objective(config) -> AbstractObjective:
    if config.model == "prompt":
        return PROMPT_OBJECTIVES[config.objective](prompt_data(config)[1])
    if config.objective == "logistic" and stored_programs_dir() is not None:
        return _direction(config)
    if config.objective == "square" and stored_programs_dir() is not None:
        return _regression(config)
    return OBJECTIVES[config.objective](stream(config.seed, 2), config)


def prompt_data(config) -> tuple:
    """(X, y, v) of model prompt: `prompt_task` from fold_in(key(seed), 2)."""
    return _prompt_task(config.seed, config.data_samples(), config.tokens, config.dim)


@functools.lru_cache(maxsize=8)
def _prompt_task(seed: int, samples: int, tokens: int, dim: int) -> tuple:
    # drawn once per process, not once per piece of initializations
    return prompt_task(stream(seed, 2), samples, tokens, dim)


def model(config, start: int, stop: int) -> AbstractModel:
    return MODELS[config.model](config, start, stop)


def value_model(config, start: int, stop: int):
    if stored_programs_dir() is not None:
        V, a = _normals(config, start, stop - start)
        scales = dict(v_scale=config.v_scale, a_scale=config.a_scale, a_offset=config.a_offset)
        return scaled_ensemble(V, a, **scales, norm=norm(config))
    return init_ensemble(
        stream(config.seed, 1),
        stop - start,
        tokens=config.tokens,
        dim=config.dim,
        v_scale=config.v_scale,
        a_scale=config.a_scale,
        a_offset=config.a_offset,
        norm=norm(config),
        start=start,
    )


def value_stand_in(config, n: int) -> ValueAttention:
    """n initializations of `value_model`'s structure, shapes, dtype and normalization,
    all zeros and without its draws: what a program is loaded (or traced) and compiled
    on while the draws are computed (only those are read). Put from host memory, with no
    program of its own to compile or load."""
    zeros = lambda *shape: jax.device_put(np.zeros(shape, jnp.result_type(float)))
    return ValueAttention(
        zeros(n, config.dim, config.tokens), zeros(n, config.tokens), normalization(norm(config))
    )


def prompt_model(config, start: int, stop: int):
    X, _, v = prompt_data(config)
    return init_prompts(
        stream(config.seed, 1),
        stop - start,
        X,
        v,
        p_scale=config.p_scale,
        v_scale=config.v_scale if config.train == "vp" else None,
        norm=norm(config),
        train=config.train,
        start=start,
    )


#: model name -> builder(config, start, stop): initializations start .. stop - 1.
MODELS = {"value": value_model, "prompt": prompt_model}


def times(config) -> np.ndarray:
    if config.method == "flow":
        return save_times(config.t1, config.n_save)
    return save_steps(config.steps, config.n_save) * config.lr
