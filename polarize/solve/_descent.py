"""Discrete optimizers (any optax GradientTransformation) on the same models and objectives.

`descend(model, objective, 0.1, steps=...)` is plain gradient descent at lr 0.1 and
reports time as steps x lr, directly comparable with `flow`. Each initialization
carries its own optimizer state, so Adam or momentum act per initialization exactly
as in a Python loop over them.

With `targets` (hitting-time `Targets`), `descend` also returns, per initialization, the
first step index k = 0..steps whose iterate reaches each target, checked on the very
iterates it steps; `descend_with_hitting_times` turns them into times k x lr.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int

from ..core import _batching as ensembles, status as codes
from ..core._batching import Precision, ensemble_size, exact_matmuls
from ..core._choices import LEVELS, LOSS_FRACTION, check_levels, time_names
from ..core._errors import PolarizeError, check_positive
from ..core._models import AbstractModel
from ..core._objectives import AbstractObjective
from ..core._refuse import refuse_if
from ..core._times import save_steps
from ..core._trajectory import Trajectory, all_finite, observe
from ..core.fields import Path, prepare
from ._devices import release_programs_if_crowded
from ._options import Targets


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
    targets: Targets | None = None,
) -> Trajectory | tuple[Trajectory, Int[Array, "*inits targets"]]:
    """Run `steps` optimizer updates theta <- theta + update(grad L) on every initialization.

    Args:
        model, objective: as for `flow` (either may be batched).
        optimizer: an optax transformation, or a float lr meaning `optax.sgd(lr)` (then
            the rate is data: descents that differ only in it share one compiled program,
            and it may be traced by `jax.jit` or `jax.grad`, checked at run time).
        steps: number of updates.
        lr: the step size used to report time as step x lr with an optax optimizer
            (taken from `optimizer` when it is a float: giving another one is refused);
            without it, time is the step index.
        n_save: about this many saved steps, log-spaced; or `save_at`, explicit indices.
        path: gradient form, as for `flow`. With a float lr (plain gradient descent) "auto"
            may step in the reduced coordinates ("reduced", "span"), which is exactly the
            same iteration; with an optax optimizer it uses "analytic" or "autodiff".
        precision, block_size: as for `flow`.
        targets: hitting-time `Targets` (`Targets.of(levels, loss_fraction)`), checked at
            every step k = 0..steps (0: the start) on the iterate descent carries, in its
            own coordinates; with them descent runs to `steps` even past the last saved step.

    Returns:
        A `Trajectory` with `steps` holding the saved step indices. An initialization
        that goes NaN/Inf gets ok=False and status `polarize.status.NONFINITE`, one whose
        loss at a saved step rose past `DIVERGED_RISE` times its first saved value (or
        past `DIVERGED_RISE` where that is below 1) status `DIVERGED`; others are
        unaffected. With `targets`: `(trajectory, first)`, `first` (*inits, targets)
        the first step index reaching each target, -1 where none did (the trajectory is
        bit for bit the one without targets).
    """
    steps = check_positive("steps", steps, integer=True)
    if isinstance(optimizer, bool):
        raise PolarizeError(
            "`optimizer` must be an optax GradientTransformation or a learning rate; got a bool"
        )
    plain = isinstance(optimizer, int | float) or (
        not isinstance(optimizer, optax.GradientTransformation)
        and np.shape(optimizer) == ()
        and _is_real(optimizer)
    )
    if plain and isinstance(optimizer, jax.core.Tracer):  # under jit or grad: checked at run time
        if lr is not None:
            raise PolarizeError("`lr` and a traced learning rate as `optimizer`: pass the rate once")
        lr = optimizer = _positive_rate(optimizer)
    elif plain:
        rate = check_positive("lr", float(optimizer))
        if lr is not None and lr != rate:
            raise PolarizeError(
                f"`lr`={lr!r} conflicts with the learning rate {rate!r} given as `optimizer`; "
                "pass the learning rate once"
            )
        # the rate as data, not baked into a transformation: descents that differ only
        # in it share one compiled program (a sweep's measure program still holds its lr)
        lr, optimizer = rate, jnp.asarray(rate)
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise PolarizeError(
            "`optimizer` must be an optax GradientTransformation or a float learning rate; "
            f"got {type(optimizer).__name__}"
        )
    if lr is not None:
        lr = _positive_rate(lr) if isinstance(lr, jax.core.Tracer) else check_positive("lr", lr)
    block_size = ensembles.block_size_or_default(block_size)
    release_programs_if_crowded(model, objective)
    model, objective, field = prepare(model, objective, path=path, precision=precision, euclidean=not plain)
    if save_at is None:
        marks = save_steps(steps, check_positive("n_save", n_save, integer=True))
    else:
        given = np.asarray(save_at)
        if given.ndim != 1 or given.size == 0 or not _whole(given):
            raise PolarizeError(
                f"`save_at` must be a list of whole step indices in [0, {steps}]; got {save_at!r}"
            )
        marks = np.unique(given.astype(np.int64))
        if marks[0] < 0 or marks[-1] > steps:
            raise PolarizeError(f"`save_at` must hold step indices in [0, {steps}]")
    marks = tuple(int(k) for k in marks)
    run = (optimizer, marks, field, block_size, plain, targets, steps)
    # the saved times and step indices are shared, the rest is per initialization
    shared = lambda out: (out[0].ts, out[0].steps)
    out = ensembles.in_threads(_descend, model, objective, *run, _block=block_size, _shared=shared)
    if out is None:
        out = _descend(model, objective, *run)
    traj, first = out
    rate = 1.0 if lr is None else lr
    ts, status, ok = _times_and_status(np.asarray(marks), rate, traj.loss, traj.ok, dtype=traj.a.dtype)
    traj = eqx.tree_at(lambda t: (t.ts, t.status, t.ok), traj, (ts, status, ok))
    return traj if targets is None else (traj, first)


@functools.partial(jax.jit, static_argnames="dtype")
def _times_and_status(marks, rate, loss, ok, *, dtype):
    """The saved steps' times (step x rate) and each initialization's status, as one
    program: as separate operations they compiled ten small programs on a descent's first
    call (about 0.4 s of the toy's 2.6 s). The same operations, so the same numbers."""
    ts = jnp.asarray(marks, dtype=dtype) * rate
    # a loss that rose a millionfold above its first saved value (or above 1e6 where that
    # is below 1) has run away: diverged, however finite its numbers still are
    ceiling = DIVERGED_RISE * jnp.maximum(loss[..., :1], 1.0)
    diverged = jnp.any(loss > ceiling, axis=-1)
    status = jnp.where(ok, jnp.where(diverged, codes.DIVERGED, codes.OK), codes.NONFINITE)
    return ts, status.astype(jnp.int32), status == codes.OK


def _positive_rate(rate):
    """A traced learning rate, refused at run time unless positive and finite."""
    bad = lambda x, xp: ~(xp.isfinite(x) & (x > 0))
    return refuse_if(rate, bad, "`lr` must be a positive finite number")


def _is_real(x) -> bool:
    """A real number: a Python, numpy or (concrete or traced) JAX scalar, not a bool."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))


def _whole(x: np.ndarray) -> bool:
    """Every entry a whole number (integers, or floats without a fraction)."""
    if np.issubdtype(x.dtype, np.integer):
        return True
    return np.issubdtype(x.dtype, np.floating) and bool(np.all(np.isfinite(x) & (x == np.round(x))))


#: How far a descent's loss may rise above its first saved value (at least 1) before
#: the initialization counts as diverged.
DIVERGED_RISE = 1e6


def descend_with_hitting_times(
    model: AbstractModel,
    objective: AbstractObjective,
    lr: float,
    *,
    steps: int,
    levels=LEVELS,
    loss_fraction: float | None = LOSS_FRACTION,
    **options,
) -> tuple[Trajectory, dict[str, Float[Array, "*inits"]]]:
    """`descend(model, objective, lr, steps=steps, **options)` and its hitting times, from
    one descent: the first step index k whose iterate reaches each level, times lr.

    Returns:
        (trajectory, {"time_to_<level>": ..., "time_to_loss_<fraction>": ...}), each
        (inits,) or a scalar: k x lr (0 when reached at the start; k itself for an optax
        optimizer, as the trajectory's `ts`), inf where not reached within `steps`, NaN
        where the run failed (`ok` False).
    """
    names = time_names(check_levels(levels), loss_fraction)
    targets = Targets.of(levels, loss_fraction)
    traj, first = descend(model, objective, lr, steps=steps, targets=targets, **options)
    # (descend checked it) a traced rate stays traced; a concrete one is a Python float, so
    # that a float32 rate does not make the times float32
    if isinstance(lr, optax.GradientTransformation):
        rate = 1.0
    else:
        rate = lr if isinstance(lr, jax.core.Tracer) else float(lr)
    return traj, dict(zip(names, _hitting_times(first, rate, traj.ok), strict=True))


@jax.jit
def _hitting_times(first, rate, ok) -> tuple:
    """Each target's times k x rate (inf where never reached, NaN where the run failed),
    as one program (see `_times_and_status`)."""
    times = jnp.where(first >= 0, first * rate, jnp.inf)
    times = jnp.where(ok[..., None], times, jnp.nan)
    return tuple(times[..., j] for j in range(times.shape[-1]))


def descent_hitting_times(
    model: AbstractModel,
    objective: AbstractObjective,
    lr: float,
    *,
    steps: int,
    levels=LEVELS,
    loss_fraction: float | None = LOSS_FRACTION,
) -> dict[str, Float[Array, "*inits"]]:
    """For plain gradient descent at `lr`: the first step index k whose iterate reaches
    each level (k = 0 is the start), times lr; inf where not reached within `steps`.

    The hits are those `polarize.descend` tracks on its own iterates
    (`descend_with_hitting_times`, saving only the last step). NaN where an iterate went
    non-finite.
    """
    lr = check_positive("lr", lr)
    options = dict(steps=steps, levels=levels, loss_fraction=loss_fraction, save_at=[steps])
    return descend_with_hitting_times(model, objective, lr, **options)[1]


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


@eqx.filter_jit
@exact_matmuls
def _descend(model, objective, optimizer, marks, system, block_size, flat, targets, steps):
    """`descend`'s program; `optimizer` an optax transformation, or the learning rate of
    plain gradient descent as an array (`optax.sgd` of it, in the state's dtype)."""
    single = ensemble_size(model, objective) is None
    if single:  # step one initialization as a block of one
        model = eqx.tree_at(
            lambda m: [getattr(m, n) for n in m.trainable],
            model,
            [getattr(model, n)[None] for n in model.trainable],
        )
    dynamic, static = ensembles.partition_inits((model, objective))

    def per_init(fn):
        """fn(model, objective, *rest) of one initialization, over a block's trailing inits axis."""
        return jax.vmap(lambda d, *rest: fn(*eqx.combine(d, static), *rest), in_axes=-1, out_axes=-1)

    def one_step(model, objective, theta, opt_state, constants):
        grads = jax.tree.map(jnp.negative, system(theta, model, objective, constants))
        updates, opt_state = optimizer.update(grads, opt_state, theta)  # an optax transformation here
        return optax.apply_updates(theta, updates), opt_state

    def run_block(block):
        # The block's state keeps the inits axis last (struct of arrays): the reductions
        # over tokens in each step become elementwise operations across inits.
        block = jax.tree.map(lambda x: jnp.moveaxis(x, 0, -1), block)
        constants = per_init(system.constants)(block)
        theta = per_init(system.initial)(block)
        if isinstance(optimizer, jax.Array):  # a Python float's rounding, in the state's dtype
            opt = optax.sgd(optimizer.astype(jax.tree.leaves(theta)[0].dtype))
        else:
            opt = optimizer
        pack, unpack = _packing(theta)
        if flat:
            # plain SGD is elementwise: step one (state, inits) array instead of one per
            # leaf, the same arithmetic in fewer, larger kernels
            field = per_init(lambda m, o, th, c: system(th, m, o, c))

            def advance(carry):
                x, opt_state = carry
                grads = jnp.negative(pack(field(block, unpack(x), constants)))
                updates, opt_state = opt.update(grads, opt_state, x)
                return optax.apply_updates(x, updates), opt_state

            carry = (pack(theta), opt.init(pack(theta)))
            as_tree, as_row = unpack, lambda x: x  # the stepped state x: packed
        else:
            carry = (theta, per_init(lambda m, o, th: opt.init(th))(block, theta))
            step = per_init(one_step)

            def advance(carry):
                return step(block, *carry, constants)

            as_tree, as_row = (lambda x: x), pack  # the stepped state x: theta's tree

        # One scan over all steps, one step per loop trip, so one loop body to compile
        # whatever steps are saved: the state before step k is kept in row j of `kept`
        # where k is the j-th saved step (row n takes the others), and checked against the
        # targets if any. Its length is static, so the loop is reverse-differentiable; a
        # kept row's tangent needs only the row index. (Before: one scan per segment between
        # saved steps, one compiled body each; for an optax optimizer, 64 by default.)
        # Unrolled, Adam and momentum ran 20-30% faster but compiled 3x longer, and their
        # numbers depended on which steps were saved (benchmarks/NOTES.md).
        n, k_ = len(marks), lambda k: jnp.asarray(k, _index_dtype())
        at = k_(marks + (-1,))  # at[j]: the next saved step (-1: none left)
        if targets is None:
            check = lambda first, x, k: first
            first = None
        else:
            levels = per_init(targets.levels)(block)  # (targets, inits)
            reached = per_init(
                lambda m, o, th, c, lv: targets.from_observed(*system.observe(th, m, o, c), lv) >= 0
            )
            first = jnp.full(targets.kinds.shape + (block_size,), -1, _index_dtype())

            def check(first, x, k):  # first hits (targets, inits) after reading state x of step k
                return jnp.where((first < 0) & reached(block, as_tree(x), constants, levels), k, first)

        def read(x, seen, k):
            first, kept, j = seen
            row = jnp.where(at[j] == k, j, n)
            kept = jax.lax.dynamic_update_index_in_dim(kept, as_row(x), row, 0)
            return check(first, x, k), kept, j + (at[j] == k)

        def body(carry, k):
            state, seen = carry
            return (advance(state), read(state[0], seen, k)), None

        row = as_row(carry[0])
        kept = jnp.zeros((n + 1,) + row.shape, row.dtype)
        start = (carry, (first, kept, k_(0)))
        carry, _ = jax.lax.scan(body, start, jnp.arange(steps, dtype=_index_dtype()))
        first, kept, _ = read(carry[0][0], carry[1], k_(steps))
        stack = lambda saved: jax.tree.map(lambda *xs: jnp.moveaxis(jnp.stack(xs), -1, 0), *saved)
        saved = stack([unpack(kept[i]) for i in range(n)])  # (inits, marks, ...)
        return saved, None if first is None else first.T  # first: (inits, targets)

    states, first = ensembles.block_map(run_block, dynamic, block_size=block_size)

    def finish(block):
        (model, objective), ys = eqx.combine(block[0], static), block[1]
        path, a = system.value_path(ys, model, objective)
        weights, loss = observe(model, objective, path, a)
        ok = all_finite((path, a, weights, loss))
        return path, a, weights, loss, ok, jnp.where(ok, codes.OK, codes.NONFINITE).astype(jnp.int32)

    out = ensembles.blockwise(finish, (dynamic, states), block_size=block_size)
    V, a, weights, loss, ok, status = jax.tree.map(lambda x: x[0], out) if single else out
    if single and first is not None:
        first = first[0]
    ts = jnp.asarray(marks, dtype=a.dtype)
    step_index = jnp.asarray(marks, dtype=_index_dtype())
    traj = Trajectory(ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=step_index)
    return traj, first


def _index_dtype():
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
