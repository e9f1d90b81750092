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

from ..core import _batching as ensembles, status as codes
from ..core._batching import Precision, ensemble_size, exact_matmuls
from ..core._errors import PolarizeError, check_positive
from ..core._models import AbstractModel
from ..core._objectives import AbstractObjective
from ..core._trajectory import Trajectory, all_finite, observe
from ..core.fields import Path, prepare


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
    block_size = ensembles.block_size_or_default(block_size)
    model, objective, field = prepare(model, objective, path=path, precision=precision, euclidean=not plain)
    if save_at is None:
        marks = save_steps(steps, check_positive("n_save", n_save, integer=True))
    else:
        marks = np.unique(np.asarray(save_at, dtype=np.int64))
        if marks.size == 0 or marks[0] < 0 or marks[-1] > steps:
            raise PolarizeError(f"`save_at` must hold step indices in [0, {steps}]")
    marks = tuple(int(k) for k in marks)
    run = (optimizer, marks, field, block_size, plain)
    # the saved times and step indices are shared, the rest is per initialization
    shared = lambda t: (t.ts, t.steps)
    traj = ensembles.in_threads(_descend, model, objective, *run, _block=block_size, _shared=shared)
    if traj is None:
        traj = _descend(model, objective, *run)
    ts = jnp.asarray(marks, dtype=traj.a.dtype) * (1.0 if lr is None else lr)
    status = jnp.where(traj.ok, codes.OK, codes.NONFINITE).astype(jnp.int32)
    return eqx.tree_at(lambda t: (t.ts, t.status), traj, (ts, status))


# One transformation object per lr, so repeated calls reuse the compiled loop.
_sgd = functools.lru_cache(maxsize=64)(optax.sgd)


def _packing(theta):
    """(pack, unpack) between a block's state pytree (inits axis last) and one
    (numbers per init, inits) array."""
    leaves, treedef = jax.tree.flatten(theta)
    size = leaves[0].shape[-1]
    shapes = [x.shape[:-1] for x in leaves]
    cuts = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]

    def pack(tree):
        return jnp.concatenate([x.reshape(-1, size) for x in jax.tree.leaves(tree)])

    def unpack(x):
        parts = jnp.split(x, cuts)
        return jax.tree.unflatten(treedef, [p.reshape(shape + (size,)) for p, shape in zip(parts, shapes)])

    return pack, unpack


#: Steps unrolled per loop iteration of descent (fewer loop trips, same arithmetic).
UNROLL = 8


@eqx.filter_jit
@exact_matmuls
def _descend(model, objective, optimizer, marks, system, block_size, flat):
    single = ensemble_size(model, objective) is None
    if single:  # step one initialization as a block of one
        model = eqx.tree_at(
            lambda m: [getattr(m, n) for n in m.trainable],
            model,
            [getattr(model, n)[None] for n in model.trainable],
        )
    is_none = lambda x: x is None
    axes = (ensembles.batch_axes(model), ensembles.batch_axes(objective))
    batched = jax.tree.map(lambda ax: ax == 0, axes, is_leaf=is_none)
    dynamic, static = eqx.partition((model, objective), batched)

    def per_init(fn):
        """fn(model, objective, *rest) of one initialization, over a block's trailing inits axis."""
        return jax.vmap(lambda d, *rest: fn(*eqx.combine(d, static), *rest), in_axes=-1, out_axes=-1)

    def one_step(model, objective, theta, opt_state, constants):
        grads = jax.tree.map(jnp.negative, system(theta, model, objective, constants))
        updates, opt_state = optimizer.update(grads, opt_state, theta)
        return optax.apply_updates(theta, updates), opt_state

    def run_block(block):
        # The block's state keeps the inits axis last (struct of arrays): the reductions
        # over tokens in each step become elementwise operations across inits.
        block = jax.tree.map(lambda x: jnp.moveaxis(x, 0, -1), block)
        constants = per_init(system.constants)(block)
        theta = per_init(system.initial)(block)
        if flat:
            # plain SGD is elementwise: step one (state, inits) array instead of one per
            # leaf, the same arithmetic in fewer, larger kernels
            pack, unpack = _packing(theta)
            field = per_init(lambda m, o, th, c: system(th, m, o, c))

            def body(carry, _):
                x, opt_state = carry
                grads = jnp.negative(pack(field(block, unpack(x), constants)))
                updates, opt_state = optimizer.update(grads, opt_state, x)
                return (optax.apply_updates(x, updates), opt_state), None

            carry = (pack(theta), optimizer.init(pack(theta)))
        else:
            unpack = lambda x: x
            carry = (theta, per_init(lambda m, o, th: optimizer.init(th))(block, theta))
            step = per_init(one_step)

            def body(carry, _):
                return step(block, *carry, constants), None

        saved, done = [], 0
        # One scan per segment between saved steps: static lengths keep the loop
        # reverse-differentiable, so gradients can flow through descent too.
        for mark in marks:
            if mark > done:
                carry, _ = jax.lax.scan(
                    body, carry, None, length=mark - done, unroll=min(UNROLL, mark - done)
                )
                done = mark
            saved.append(unpack(carry[0]))
        return jax.tree.map(lambda *xs: jnp.moveaxis(jnp.stack(xs), -1, 0), *saved)  # (inits, marks, ...)

    states = ensembles.block_map(run_block, dynamic, block_size=block_size)

    def finish(block):
        (model, objective), ys = eqx.combine(block[0], static), block[1]
        path, a = system.value_path(ys, model, objective)
        weights, loss = observe(model, objective, path, a)
        ok = all_finite((path, a, weights, loss))
        return path, a, weights, loss, ok, jnp.where(ok, codes.OK, codes.NONFINITE).astype(jnp.int32)

    out = ensembles.blockwise(finish, (dynamic, states), block_size=block_size)
    V, a, weights, loss, ok, status = jax.tree.map(lambda x: x[0], out) if single else out
    ts = jnp.asarray(marks, dtype=a.dtype)
    step_index = jnp.asarray(marks, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    return Trajectory(ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=step_index)
