"""A solve's settings, every default resolved once: `SolveOptions`, and the hitting-time targets.

`flow`, `modified_flow` and `flow_with_hitting_times` build a `SolveOptions` from their
keyword arguments, a sweep from its config (`SweepConfig.solve_options`). At the top
of a solve, `resolved(model, objective, field)` fills in what depends on the problem
(the solver and clock of `stiff.default_method`, the adjoint, the time grid as arrays
of the flow's dtype); every layer below (`_flow`, `_engine`, `_hitting`) reads the
resolved object as it is and never rebuilds it.
"""

import dataclasses
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ..core._batching import Precision, block_size_or_default, float_dtype
from ..core._choices import BLOCK_SIZE, LEVELS, LOSS_FRACTION, check_levels
from ..core._errors import PolarizeError, check_choice, check_positive
from ..core._models import AbstractModel
from ..core._objectives import AbstractObjective
from ..core._times import check_times
from ..core._weights import max_weight
from ..core.fields import PATHS, AbstractField, Path
from . import _stiff

Clock = Literal["log", "linear"]


class Targets(eqx.Module):
    """What the hitting times measure: kind 0 is a max-weight level, kind 1 a loss fraction.

    Arrays, not static settings, so new levels reuse the compiled program. Build with
    `Targets.of(levels, loss_fraction)`; the times' names are `time_names` of the same.
    """

    kinds: Int[Array, " targets"]
    values: Float[Array, " targets"]

    @classmethod
    def of(cls, levels=LEVELS, loss_fraction: float | None = LOSS_FRACTION) -> "Targets":
        """The targets of `levels` (checked) and `loss_fraction` (None: no loss target)."""
        levels = check_levels(levels)
        if loss_fraction is not None and not 0 < loss_fraction < 1:
            raise PolarizeError(f"`loss_fraction` must be in (0, 1); got {loss_fraction!r}")
        kinds = [0] * len(levels) + ([1] if loss_fraction is not None else [])
        values = list(levels) + ([loss_fraction] if loss_fraction is not None else [])
        # by device_put: jnp.asarray of host numbers compiles a program per shape
        return cls(jax.device_put(np.asarray(kinds)), jax.device_put(np.asarray(values, dtype=float)))

    def levels(self, model: AbstractModel, objective: AbstractObjective) -> Float[Array, " targets"]:
        """The levels of one initialization: loss fractions become losses (of L at the start)."""
        return self.per_init(objective(model()))

    def per_init(self, loss0) -> Float[Array, " targets"]:
        return jnp.where(self.kinds == 0, self.values, self.values * loss0).astype(loss0.dtype)

    def from_observed(self, weights, loss, levels):
        """g_j >= 0 exactly when target j is reached (max weight - level, or level - loss),
        from weights (..., tokens) and loss (...): (targets, ...). Weights with a samples
        axis, (..., samples, tokens) (prompt attention), reach a level when every sample
        does (`core._weights.max_weight`)."""
        top = max_weight(weights, loss.ndim)
        pad = lambda x: x.reshape(x.shape + (1,) * top.ndim)  # targets in front
        grow = lambda x: x.reshape((1,) * self.kinds.ndim + x.shape)
        return jnp.where(pad(self.kinds) == 0, grow(top) - pad(levels), pad(levels) - grow(loss))


class SolveOptions(eqx.Module):
    """Everything that decides how a flow is solved, from t0 to t1 and back as results.

    Fields (the defaults are `flow`'s):
        t1, t0: horizon and start, 0 <= t0 < t1 (arrays under a trace: differentiable).
        n_save, ts: `n_save` times evenly spaced in log(1 + t), or explicit times `ts`.
        solver: a diffrax solver; None: `stiff.default_method` (Rosenbrock-W for `Square`
            and `CrossEntropy` at long horizons, else Tsit5).
        rtol, atol, max_steps: the PID controller's tolerances and the per-init step cap.
        clock: "log" (tau = log(1 + t)) or "linear"; None: linear for the stiff
            objectives, log otherwise.
        path: the vector field's form (`polarize.fields`).
        adjoint: diffrax adjoint for gradients (None: checkpointed).
        precision: "float32"/"float64" casts model and objective; None keeps their dtype.
        block_size: initializations per vmapped block (part of a result's bit-identity).
        targets: hitting-time `Targets` located on the solver's steps (None: none).

    `resolved` returns the same options with every None decided for one problem:
    `solver`, `clock`, `adjoint`, the times as arrays and `ends_only` (only t0 and t1
    saved: no dense output). `restart_solver` is the solver of restarted hitting-time
    solves (`hitting_times`).
    """

    t1: Float[ArrayLike, ""]
    t0: Float[ArrayLike, ""] = 0.0
    ts: Float[ArrayLike, " times"] | None = None
    n_save: int = eqx.field(static=True, default=64)
    solver: diffrax.AbstractSolver | None = None
    rtol: float = eqx.field(static=True, default=1e-6)
    atol: float = eqx.field(static=True, default=1e-8)
    max_steps: int = eqx.field(static=True, default=100_000)
    clock: Clock | None = eqx.field(static=True, default=None)
    path: Path = eqx.field(static=True, default="auto")
    adjoint: diffrax.AbstractAdjoint | None = None
    precision: Precision | None = eqx.field(static=True, default=None)
    block_size: int = eqx.field(static=True, default=BLOCK_SIZE, converter=block_size_or_default)
    targets: Targets | None = None
    ends_only: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        for name, kind, example in (
            ("solver", diffrax.AbstractSolver, "diffrax.Tsit5()"),
            ("adjoint", diffrax.AbstractAdjoint, "diffrax.RecursiveCheckpointAdjoint()"),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise PolarizeError(
                    f"`{name}` must be a diffrax {kind.__name__.removeprefix('Abstract').lower()} such as "
                    f"{example}, or None for the default; got {value!r}"
                )
        if self.solver is not None and not isinstance(self.solver, diffrax.AbstractAdaptiveSolver):
            raise PolarizeError(  # the step size is always adapted (PID control on its error)
                "`solver` must be an adaptive diffrax solver, one with an error estimate "
                f"(diffrax.Tsit5(), Dopri5(), Kvaerno5(), Heun(), ...); got {type(self.solver).__name__}()"
            )
        if check_positive("n_save", self.n_save, integer=True) < 2 and self.ts is None:
            raise PolarizeError(f"`n_save` must be >= 2 (the first and last saved times); got {self.n_save}")
        check_positive("max_steps", self.max_steps, integer=True)
        check_positive("rtol", self.rtol)
        check_positive("atol", self.atol)
        if self.clock is not None:
            check_choice("clock", self.clock, ("log", "linear"))
        check_choice("path", self.path, PATHS)

    def resolved(
        self, model: AbstractModel, objective: AbstractObjective, field: AbstractField
    ) -> "SolveOptions":
        """These options with every default decided for `model`, `objective` and `field`."""
        solver, clock = self.solver, self.clock
        if solver is None:  # stiff objectives: Rosenbrock-W on the linear clock
            solver, default_clock = _stiff.default_method(model, objective, field, self.t1)
            clock = clock or default_clock
        dtype = float_dtype(model)  # the model's, once cast to `precision` (`fields.prepare`)
        t0, t1, ts = check_times(self.t0, self.t1, self.ts, n_save=self.n_save, dtype=dtype)
        return SolveOptions(
            t1=t1,
            t0=t0,
            ts=ts,
            n_save=self.n_save,
            solver=solver,
            rtol=self.rtol,
            atol=self.atol,
            max_steps=self.max_steps,
            clock=clock or "log",
            path=self.path,
            adjoint=diffrax.RecursiveCheckpointAdjoint() if self.adjoint is None else self.adjoint,
            precision=self.precision,
            block_size=self.block_size,
            targets=self.targets,
            ends_only=self.ts is None and self.n_save == 2,  # t0 and t1 only: no interpolation
        )

    def restart_solver(self) -> diffrax.AbstractSolver:
        """The solver of restarted hitting-time solves, each over one saved interval: the
        one asked for, or Tsit5 where it was left to the default (the stiff default of
        square and cross-entropy flows is not needed for the transient where levels are
        crossed). Call it on options before `resolved`."""
        return diffrax.Tsit5() if self.solver is None else self.solver


#: The settings a user gives (`flow`'s keyword arguments); the others are resolved.
USER_SETTINGS = tuple(
    f.name for f in dataclasses.fields(SolveOptions) if f.name not in ("t1", "targets", "ends_only")
)
