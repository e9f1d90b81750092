"""A sweep's numerics: its solver and `SolveOptions`, and what it measures per initialization.

`measure(config, model, objective)` solves a batch of initializations under the config's
method (the exact flow, or descent) and reduces each to what a sweep keeps (see
`_sweep`'s module doc). This is the part of a sweep that needs diffrax, and optax for
descent only (reached through `polarize.solve`'s lazy names, so a flow sweep never loads
it: 0.1 s of a cold default sweep). The runner (`_sweep`) imports this module on first
use, so that reading a finished run loads neither. Like
`_build`, it imports nothing of the config (`SweepConfig` imports it on first use for
`build_solver` and `solve_options`).
"""

import dataclasses

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .. import solve as solvers
from ..core._trajectory import Trajectory
from ..core._weights import distribution
from ..measure._rates import logistic_rate
from ..measure._selection import token_selection, weight_statistics
from ..measure._statistics import final_of_one, final_statistics, order_flags_apply
from ..solve._devices import over_devices
from ..solve._flow import crosses_in_loop, decided
from ..solve._hitting import flow_and_crossings, restarted_hitting_times
from ..solve._options import SolveOptions, Targets

#: solver name -> diffrax solver class (None: `flow`'s default).
SOLVERS = {"auto": None, "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5, "kvaerno5": diffrax.Kvaerno5}


def solver(config) -> diffrax.AbstractSolver | None:
    cls = SOLVERS[config.solver]
    return None if cls is None else cls()


def solve_options(config) -> SolveOptions:
    return SolveOptions(
        t1=config.t1,
        n_save=config.n_save,
        solver=solver(config),
        rtol=config.rtol,
        atol=config.atol,
        max_steps=config.max_steps,
        block_size=config.resolved().block_size,
        targets=Targets.of(config.levels, config.loss_fraction),
    )


def solve(config, model, objective) -> Trajectory:
    """The trajectories of `model` (a batch of initializations) under the config's method."""
    return solve_with_times(config, model, objective)[0]


def solve_with_times(config, model, objective) -> tuple[Trajectory, dict | None]:
    """The trajectories and, for descent or a flow in the engine's batched loop, the config's
    hitting times from the same solve (None otherwise: `measure` then restarts on one device)."""
    if config.method == "flow":
        return flow_and_crossings(model, objective, config.solve_options(), config.time_names())
    # descent checks the targets on the iterates it steps, in the same scan
    levels = dict(levels=config.levels, loss_fraction=config.loss_fraction)
    saves = dict(n_save=config.n_save, block_size=config.resolved().block_size)
    descend = solvers.descend_with_hitting_times  # loads optax, on a descent sweep only
    return descend(model, objective, config.lr, steps=config.steps, **levels, **saves)


@dataclasses.dataclass(frozen=True)
class _Solved:
    """The per-device part of `measure` for `config` (its `program()`): equal for equal
    settings, so the sharded program over several devices is compiled once, not once per
    chunk. `method`: (solver, clock) decided beforehand (see `measure`)."""

    config: object
    method: tuple | None = None

    def __call__(self, model, objective):
        config = self.config
        # model prompt keeps its trajectories: its token selection is measured on the host
        reduce = _Reduce.of(config) if config.model == "value" else None
        if config.method == "flow":
            options, names = _options(config, self.method), config.time_names()
            result, times = flow_and_crossings(model, objective, options, names, reduce=reduce)
            if times is not None and reduce is not None:  # reduced block by block: no trajectory stored
                return {"reduced": result, "times": times}
            traj = result
        else:
            traj, times = solve_with_times(config, model, objective)
        if config.model == "prompt":
            stats = weight_statistics(traj, keep=config.snapshot_index())
        else:
            stats = final_statistics(traj, objective, keep=config.snapshot_index(), atol=config.atol)
        # per-initialization fields only (descent's `steps` are the shared saved step indices)
        fields = ("value_path", "a", "weights", "loss", "ok", "status")
        fields += ("steps",) if config.method == "flow" else ()
        return {"traj": {k: getattr(traj, k) for k in fields}, "stats": stats, "times": times}


@dataclasses.dataclass(frozen=True)
class _Reduce:
    """What a flow sweep keeps of ONE initialization's trajectory (`solve_flow`'s
    `reduce`): its final statistics, snapshots and logistic rate, as `measure` computes
    them from stored trajectories. It is part of a compiled program's key, and equal for
    equal values of what it reads: sweeps and study cells that differ only in settings it
    does not read (their levels, say) share one traced program."""

    keep: tuple
    ts: tuple
    t1: float
    rate: bool
    atol: float

    @classmethod
    def of(cls, config) -> "_Reduce":
        keep = tuple(int(k) for k in config.snapshot_index())
        ts = tuple(float(t) for t in config.times())
        return cls(keep, ts, float(config.horizon()), config.fits_rate(), float(config.atol))

    def __call__(self, path, a, weights, loss, ok, objective):
        flags = order_flags_apply(objective, path, a)
        b = objective.direction() if flags else jnp.zeros(1, a.dtype)
        out = final_of_one(path, a, weights, loss, ok, b, flags=flags, keep=self.keep, atol=self.atol)
        if self.rate:
            fit = logistic_rate(np.asarray(self.ts), jnp.max(distribution(weights), axis=-1), t1=self.t1)
            out.update({k: jnp.where(ok, v, jnp.nan) for k, v in fit.items()})
        return out


def measure(config, model, objective, *, devices=None) -> dict:
    """Everything a sweep keeps per initialization, for a batch of them (see the module doc).

    The solves, hitting times and statistics are split over `devices`; the numbers do
    not depend on the device count. Flows whose solver runs outside the engine's batched
    loop (the stiff default, implicit solvers) run on one device: their solves, and the
    root finding of their restarted hitting times, rounded differently inside
    `shard_map` (and an implicit solver's linear solve failed there). With several
    devices the solver and clock are decided here, on the concrete objective.
    """
    devices, method = tuple(devices or jax.local_devices()), None
    if config.method == "flow" and len(devices) > 1:
        # decided here on the concrete objective: traced inside the devices' program its
        # curvature is unknown, and the default would take the stiff method at any horizon
        options = decided(model, objective, config.solve_options())
        method = (options.solver, options.clock)
        if not crosses_in_loop(options):  # rounds otherwise in `shard_map`
            devices = devices[:1]
    block_size = config.resolved().block_size
    out = over_devices(_Solved(config.program(), method), model, objective, devices, block_size=block_size)
    if "reduced" in out:
        reduced = dict(out["reduced"])
        ok, status, steps = (reduced.pop(k) for k in ("ok", "status", "steps"))
        return {**reduced, **out["times"], "solver_steps": steps, "ok": ok, "status": status}
    parts = out["traj"]
    traj = Trajectory(ts=jnp.asarray(config.times()), V=parts.pop("value_path"), **parts)
    times = out["times"]
    out = dict(out["stats"])
    if config.method == "flow":
        if times is None:
            options, names = config.solve_options(), config.time_names()
            times = restarted_hitting_times(traj, model, objective, options, names)
        out.update(times)
        out["solver_steps"] = traj.steps
    else:  # descent's, NaN where `traj.ok` is False
        out.update(times)
    if config.fits_rate():
        max_weight = jnp.max(distribution(traj.weights), axis=-1)
        rate = logistic_rate(config.times(), max_weight, t1=config.horizon())
        out.update({k: jnp.where(traj.ok, v, jnp.nan) for k, v in rate.items()})
    if config.model == "prompt":
        out.update(_selection_arrays(config, traj, model, objective))
    out["ok"], out["status"] = traj.ok, traj.status
    return out


def _selection_arrays(config, traj: Trajectory, model, objective) -> dict[str, np.ndarray]:
    """What a prompt sweep keeps of `token_selection` per initialization: each number of
    `TokenSelection.final()` as `final_<name>` (|p| as `final_p_norm`: `norm` is the
    normalization's setting), the selected and best-score tokens `final_selected`,
    `final_best` (inits, samples), and `snap_cos_selected` at the snapshots (float32)."""
    selection = token_selection(traj, model, objective)
    names = {"norm": "p_norm"}
    out = {f"final_{names.get(k, k)}": v for k, v in selection.final().items() if k != "ok"}
    out["final_selected"] = selection.selected.astype(np.int32)
    out["final_best"] = selection.best.astype(np.int32)
    out["snap_cos_selected"] = selection.cos_selected[:, config.snapshot_index()].astype(np.float32)
    return out


def _options(config, method: tuple | None):
    """The config's flow options, with `method` (solver, clock) in place of its own."""
    options = config.solve_options()
    if method is None:
        return options
    solver, clock = method
    return dataclasses.replace(options, solver=solver, clock=clock)
