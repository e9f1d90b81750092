"""The exact gradient flow dtheta/dt = -grad L(theta), integrated by diffrax.

Polarization lives on a logarithmic clock (1 - max s ~ C / (log t)^2 under the
logistic loss), so by default the ODE is integrated in tau = log(1 + t):
dtheta/dtau = (1 + t) dtheta/dt. Horizons such as t = 1e30 then take a few hundred
steps and nothing overflows.
"""

from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import ensembles, status as codes
from .dynamics import Path, System, choose_path
from .engine import integrate
from .ensembles import ensemble_size, over_inits
from .errors import PolarizeError, check_choice, check_positive
from .models import AbstractModel
from .objectives import AbstractObjective
from .trajectory import Trajectory, all_finite, observe

Clock = Literal["log", "linear"]
Precision = Literal["float32", "float64"]


def at_precision(tree, precision: Precision | None):
    """`tree` with every floating array cast to `precision` (unchanged when None).

    float32 halves memory and is faster, at an accuracy cost measured in
    benchmarks/RESULTS.md; float64 needs `jax_enable_x64`.
    """
    if precision is None:
        return tree
    check_choice("precision", precision, ("float32", "float64"))
    if precision == "float64" and not jax.config.jax_enable_x64:
        raise PolarizeError("`precision='float64'` needs jax.config.update('jax_enable_x64', True)")
    dtype = jnp.dtype(precision)

    def cast(x):
        floating = eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(dtype) if floating else x

    return jax.tree.map(cast, tree)


def float_dtype(model: AbstractModel):
    """The floating dtype the model's trainable arrays share (the dtype of the flow)."""
    return jnp.result_type(*(getattr(model, name) for name in model.trainable))


def save_times(t1: float, n_save: int = 64, t0: float = 0.0) -> np.ndarray:
    """n_save times from t0 to t1, evenly spaced in log(1 + t) (t0 and t1 included)."""
    ts = np.expm1(np.linspace(np.log1p(t0), np.log1p(t1), n_save))
    ts[0], ts[-1] = t0, t1  # exact ends: log1p/expm1 can round one ulp past t1
    return ts


def _check_times(t0, t1, ts):
    for name, value in (("t0", t0), ("t1", t1)):
        if isinstance(value, jax.core.Tracer):
            continue
        if not np.isfinite(value):
            raise PolarizeError(f"`{name}` must be finite; got {name}={value!r}")
    if not isinstance(t0, jax.core.Tracer) and t0 < 0:
        raise PolarizeError(f"`t0` must be >= 0; got t0={t0!r}")
    if not any(isinstance(v, jax.core.Tracer) for v in (t0, t1)) and not float(t1) > float(t0):
        raise PolarizeError(f"`t1` must be greater than `t0`; got t0={t0!r}, t1={t1!r}")
    traced = any(isinstance(v, jax.core.Tracer) for v in (t0, t1, ts))
    if ts is not None and not traced:
        ts_np = np.asarray(ts, dtype=float)
        if ts_np.ndim != 1 or ts_np.size == 0 or not np.all(np.isfinite(ts_np)):
            raise PolarizeError("`ts` must be a non-empty 1-D array of finite times")
        if np.any(np.diff(ts_np) < 0) or ts_np[0] < float(t0) or ts_np[-1] > float(t1):
            raise PolarizeError(f"`ts` must be non-decreasing and lie in [t0, t1] = [{t0}, {t1}]")


def flow(
    model: AbstractModel,
    objective: AbstractObjective,
    *,
    t1: float,
    t0: float = 0.0,
    n_save: int = 64,
    ts=None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    clock: Clock = "log",
    path: Path = "auto",
    adjoint: diffrax.AbstractAdjoint | None = None,
    precision: Precision | None = None,
    block_size: int | None = None,
) -> Trajectory:
    """Integrate dtheta/dt = -grad L(theta) from t0 to t1 for every initialization.

    Args:
        model: a model, or a batch of them (leading inits axis).
        objective: the loss of beta; may be batched like the model.
        t1, t0: horizon and start (0 <= t0 < t1).
        n_save: number of saved times, evenly spaced in log(1 + t), when `ts` is None.
        ts: explicit save times in [t0, t1] instead.
        solver: any diffrax solver (default Tsit5; Kvaerno5 for stiff problems).
        rtol, atol: tolerances of the PID step-size controller.
        max_steps: per-initialization cap on solver steps.
        clock: "log" integrates in tau = log(1 + t), "linear" in t itself.
        path: vector-field form, see `polarize.dynamics` ("auto" picks the cheapest).
        adjoint: diffrax adjoint for gradients through the solve (default: checkpointed).
        precision: "float32" or "float64" casts model and objective first; None (default)
            keeps the model's dtype (an ensemble built in float32 flows in float32).
        block_size: initializations per vmapped block (default `ensembles.BLOCK_SIZE`);
            results are bit-identical for a fixed block size whatever the batch size.

    Returns:
        A `Trajectory`. A failed initialization gets ok=False and its diffrax result
        code in `status`; the rest of the batch is unaffected.
    """
    check_choice("clock", clock, ("log", "linear"))
    n_save = check_positive("n_save", n_save, integer=True)
    max_steps = check_positive("max_steps", max_steps, integer=True)
    check_positive("rtol", rtol)
    check_positive("atol", atol)
    _check_times(t0, t1, ts)
    precision = precision or jnp.dtype(float_dtype(model)).name  # the objective follows the model
    model, objective = at_precision((model, objective), precision)
    ensemble_size(model, objective)
    block_size = check_positive("block_size", block_size or ensembles.BLOCK_SIZE, integer=True)
    form = choose_path(model, objective, path)
    solver = diffrax.Tsit5() if solver is None else solver
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
    ends_only = ts is None and n_save == 2  # save t0 and t1 only: no dense interpolation
    if ts is None:
        if isinstance(t1, jax.core.Tracer) or isinstance(t0, jax.core.Tracer):
            ts = jnp.expm1(jnp.linspace(jnp.log1p(t0), jnp.log1p(t1), n_save))
        else:
            ts = save_times(t1, n_save, t0)
    ts = jnp.asarray(ts, dtype=float_dtype(model))
    return _flow(
        model,
        objective,
        ts,
        jnp.asarray(t0, ts.dtype),
        jnp.asarray(t1, ts.dtype),
        System(form),
        solver,
        rtol,
        atol,
        max_steps,
        clock,
        adjoint,
        block_size,
        ends_only,
    )


@eqx.filter_jit
def _flow(
    model, objective, ts, t0, t1, system, solver, rtol, atol, max_steps, clock, adjoint, block_size, ends_only
):
    log = clock == "log"
    to_solver = jnp.log1p if log else (lambda t: t)

    def vector_field(s, y, args):
        model, objective, constants = args
        dy = system.field(y, model, objective, constants)
        if log:
            return jax.tree.map(lambda d: jnp.exp(s) * d, dy)
        return dy

    single = ensemble_size(model, objective) is None
    if single:  # the engine always sees an inits axis
        model = eqx.tree_at(
            lambda m: [getattr(m, n) for n in m.trainable],
            model,
            [getattr(model, n)[None] for n in model.trainable],
        )
    axes = (ensembles.batch_axes(model), ensembles.batch_axes(objective))
    y0, constants = over_inits(
        lambda m, o: (system.initial(m, o), system.constants(m, o)), model, objective, block_size=block_size
    )
    # log1p(expm1(x)) can exceed x by one ulp, and diffrax rejects a save time past t1.
    save_at = jnp.clip(to_solver(ts), to_solver(t0), to_solver(t1))
    sol = integrate(
        vector_field,
        y0,
        (model, objective, constants),
        (*axes, 0),
        t0=to_solver(t0),
        t1=to_solver(t1),
        ts=save_at,
        ends_only=ends_only,
        solver=solver,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        adjoint=adjoint,
        block_size=block_size,
    )

    def finish(model, objective, ys, status):
        trainable = system.trainable(ys, model, objective)
        weights, loss = observe(model, objective, trainable)
        ok = (status == codes.OK) & all_finite((trainable, weights, loss))
        return trainable, weights, loss, ok, jnp.where((status == codes.OK) & ~ok, codes.NONFINITE, status)

    is_none = lambda x: x is None
    batched = jax.tree.map(lambda ax: ax == 0, axes, is_leaf=is_none)
    dynamic, static = eqx.partition((model, objective), batched)
    (V, a), weights, loss, ok, status = ensembles.blockwise(
        lambda x: finish(*eqx.combine(x[0], static), x[1], x[2]),
        (dynamic, sol.ys, sol.status),
        block_size=block_size,
    )
    steps = sol.steps
    if single:
        V, a, weights, loss, ok, status, steps = (x[0] for x in (V, a, weights, loss, ok, status, steps))
    return Trajectory(ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=steps)
