"""The modified flow of backward error analysis: the ODE that gradient descent follows to O(lr^2).

Gradient descent at step size lr tracks the plain flow only to O(lr); it tracks

    dtheta/dt = -grad( L + (lr/4) |grad L|^2 )

to O(lr^2) (Hairer, Lubich & Wanner; Barrett & Dherin 2021, "implicit gradient
regularization"). The penalty is a function of the trainable arrays, not of beta,
so it cannot be written as an objective for `flow`; this module integrates it
directly, on the same log clock tau = log(1 + t) and with the same per-initialization
failure reporting.
"""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .dynamics import params, with_params
from .ensembles import ensemble_size, over_inits
from .errors import PolarizeError, check_positive
from .flow import _check_times, save_times
from .models import AbstractModel
from .objectives import AbstractObjective
from .trajectory import Trajectory, all_finite, observe


def modified_loss(model: AbstractModel, objective: AbstractObjective, lr: float) -> jax.Array:
    """L + (lr/4) |grad L|^2 at `model` (single initialization), grad over the trainable arrays."""
    loss = lambda p: objective(with_params(model, p)())
    grads = jax.grad(loss)(params(model))
    return loss(params(model)) + 0.25 * lr * sum(jnp.sum(g**2) for g in jax.tree.leaves(grads))


def modified_flow(
    model: AbstractModel,
    objective: AbstractObjective,
    lr: float,
    *,
    t1: float,
    t0: float = 0.0,
    n_save: int = 64,
    ts=None,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    max_steps: int = 100_000,
) -> Trajectory:
    """Integrate dtheta/dt = -grad(L + (lr/4)|grad L|^2) from t0 to t1 for every initialization.

    Compare with `descend(model, objective, lr, steps=k)` at time t = k lr. lr = 0 gives
    the plain flow. Arguments are as for `flow` (Tsit5, PID controller, log clock);
    a failed initialization gets ok=False and a non-zero `status`.
    """
    if not (isinstance(lr, int | float) and np.isfinite(lr) and lr >= 0):
        raise PolarizeError(f"`lr` must be a finite number >= 0; got {lr!r}")
    n_save = check_positive("n_save", n_save, integer=True)
    max_steps = check_positive("max_steps", max_steps, integer=True)
    check_positive("rtol", rtol)
    check_positive("atol", atol)
    _check_times(t0, t1, ts)  # the same checks and messages as `flow`
    ensemble_size(model, objective)
    ts = np.asarray(save_times(t1, n_save, t0) if ts is None else ts, dtype=float)
    dtype = jnp.result_type(float)
    traj = _modified_flow(
        model,
        objective,
        jnp.asarray(lr, dtype),
        jnp.asarray(ts, dtype),
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        rtol,
        atol,
        max_steps,
    )
    return traj


@eqx.filter_jit
def _modified_flow(model, objective, lr, ts, t0, t1, rtol, atol, max_steps):
    def vector_field(tau, theta, args):
        m, o = args
        grads = jax.grad(lambda p: modified_loss(with_params(m, p), o, lr))(theta)
        return jax.tree.map(lambda g: -jnp.exp(tau) * g, grads)  # dtheta/dtau = (1 + t) dtheta/dt

    def solve_one(model, objective):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Tsit5(),
            t0=jnp.log1p(t0),
            t1=jnp.log1p(t1),
            dt0=None,
            y0=params(model),
            args=(model, objective),
            saveat=diffrax.SaveAt(ts=jnp.log1p(ts)),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=max_steps,
            throw=False,
        )
        weights, loss = observe(model, objective, sol.ys)
        solved = sol.result == diffrax.RESULTS.successful
        ok = solved & all_finite((sol.ys, weights, loss))
        status = jnp.where(ok, 0, jnp.where(solved, -1, 1)).astype(jnp.int32)
        return sol.ys, weights, loss, ok, status, sol.stats["num_accepted_steps"]

    (V, a), weights, loss, ok, status, steps = over_inits(solve_one, model, objective)
    return Trajectory(ts=ts, V=V, a=a, weights=weights, loss=loss, ok=ok, status=status, steps=steps)
