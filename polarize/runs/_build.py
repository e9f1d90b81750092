"""The objects a sweep is made of, built from its `SweepConfig`: the one place where
a sweep's strings become objects.

`SweepConfig`'s builders (`build_objective`, `build_model`, ...) call these; the
config itself imports no JAX, so this module is imported on their first use (and
imports nothing of the config: the registries' names are checked against the
config's in tests/runs/test_config.py).
"""

import functools

import jax
import numpy as np

from ..core._models import AbstractModel, init_ensemble
from ..core._normalizations import AbstractNormalization, normalization
from ..core._objectives import (
    AbstractObjective,
    conditioned_regression,
    peaked_distribution,
    random_direction,
    random_labels,
)
from ..core._prompt import LogisticLabels, SquareLabels, init_prompts, prompt_task
from ..core._times import save_steps, save_times

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


def norm(config) -> AbstractNormalization:
    options = {"softmax": {"temperature": config.temperature}, "softmax1": {"sink": config.sink}}
    return normalization(config.norm, **options.get(config.norm, {}))


def objective(config) -> AbstractObjective:
    if config.model == "prompt":
        return PROMPT_OBJECTIVES[config.objective](prompt_data(config)[1])
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
