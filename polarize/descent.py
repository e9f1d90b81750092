"""Discrete optimizers (any optax GradientTransformation) on the same models and objectives.

`descend(model, objective, 0.1, steps=...)` is plain gradient descent at lr 0.1 and
reports time as steps x lr, directly comparable with `flow`. Each initialization
carries its own optimizer state, so Adam or momentum act per initialization exactly
as in a Python loop over them.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import status as codes
from .ensembles import Precision, over_inits
from .errors import PolarizeError, check_positive
from .fields import Path, prepare
from .models import AbstractModel
from .objectives import AbstractObjective
from .trajectory import Trajectory, all_finite, observe


def save_steps(steps: int, n_save: int = 64) -> np.ndarray:
    """About n_save distinct step indices from 0 to steps, evenly spaced in log(1 + k)."""
    raw = np.expm1(np.linspace(0.0, np.log1p(steps), n_save))
    return np.unique(np.concatenate([[0], np.round(raw).astype(np.int64), [steps]]))


def descend(
    model: AbstractModel,
    objective: AbstractObjective,
    optimizer: optax.GradientTransformation | float,
    *,
    steps: int,
    lr: float | None = None,
    n_save: int = 64,
    save_at=None,
    path: Path = "auto",
    precision: Precision | None = None,
    block_size: int | None = None,
) -> Trajectory:
    """Run `steps` optimizer updates theta <- theta + update(grad L) on every initialization.

    Args:
        model, objective: as for `flow` (either may be batched).
        optimizer: an optax transformation, or a float lr meaning `optax.sgd(lr)`.
        steps: number of updates.
        lr: the step size used to report time as step x lr with an optax optimizer
            (taken from `optimizer` when it is a float: giving another one is refused);
            without it, time is the step index.
        n_save: about this many saved steps, log-spaced; or `save_at`, explicit indices.
        path: gradient form, as for `flow`. With a float lr (plain gradient descent) "auto"
            may step in the reduced coordinates ("reduced", "span"), which is exactly the
            same iteration; with an optax optimizer it uses "analytic" or "autodiff".
        precision, block_size: as for `flow`.

    Returns:
        A `Trajectory` with `steps` holding the saved step indices. An initialization
        that goes NaN/Inf gets ok=False and status `polarize.status.NONFINITE`; others
        are unaffected.
    """
    steps = check_positive("steps", steps, integer=True)
    plain = isinstance(optimizer, int | float)
    if plain:
        rate = check_positive("lr", float(optimizer))
        if lr is not None and lr != rate:
            raise PolarizeError(
                f"`lr`={lr!r} conflicts with the learning rate {rate!r} given as `optimizer`; "
                "pass the learning rate once"
            )
        lr, optimizer = rate, _sgd(rate)
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise PolarizeError(
            "`optimizer` must be an optax GradientTransformation or a float learning rate; "
            f"got {type(optimizer).__name__}"
        )
    if lr is not None:
        check_positive("lr", lr)
    model, objective, field, block_size = prepare(
        model, objective, path=path, precision=precision, block_size=block_size, euclidean=not plain
    )
    if save_at is None:
        marks = save_steps(steps, check_positive("n_save", n_save, integer=True))
    else:
        marks = np.unique(np.asarray(save_at, dtype=np.int64))
        if marks.size == 0 or marks[0] < 0 or marks[-1] > steps:
            raise PolarizeError(f"`save_at` must hold step indices in [0, {steps}]")
    marks = tuple(int(k) for k in marks)
    traj = _descend(model, objective, optimizer, marks, field, block_size)
    ts = jnp.asarray(marks, dtype=traj.V.dtype) * (1.0 if lr is None else lr)
    status = jnp.where(traj.ok, codes.OK, codes.NONFINITE).astype(jnp.int32)
    return eqx.tree_at(lambda t: (t.ts, t.status), traj, (ts, status))


# One transformation object per lr, so repeated calls reuse the compiled loop.
_sgd = functools.lru_cache(maxsize=64)(optax.sgd)


@eqx.filter_jit
def _descend(model, objective, optimizer, marks, system, block_size):
    def run_one(model, objective):
        constants = system.constants(model, objective)

        def step(carry, _):
            theta, opt_state = carry
            grads = jax.tree.map(jnp.negative, system.field(theta, model, objective, constants))
            updates, opt_state = optimizer.update(grads, opt_state, theta)
            return (optax.apply_updates(theta, updates), opt_state), None

        theta = system.initial(model, objective)
        carry = (theta, optimizer.init(theta))
        saved, done = [], 0
        # One scan per segment between saved steps: static lengths keep the loop
        # reverse-differentiable, so gradients can flow through descent too.
        for mark in marks:
            if mark > done:
                carry, _ = jax.lax.scan(step, carry, None, length=mark - done)
                done = mark
            saved.append(carry[0])
        trainable = system.trainable(jax.tree.map(lambda *xs: jnp.stack(xs), *saved), model, objective)
        weights, loss = observe(model, objective, trainable)
        ok = all_finite((trainable, weights, loss))
        return trainable, weights, loss, ok, jnp.where(ok, 0, 1).astype(jnp.int32)

    (V, a), weights, loss, ok, status = over_inits(run_one, model, objective, block_size=block_size)
    ts = jnp.asarray(marks, dtype=V.dtype)
    step_index = jnp.asarray(marks, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    return Trajectory(ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=step_index)
