"""Stiff long horizons: a Rosenbrock-W solver with a cheap exact Jacobian solve, and the default.

Why. Once a square or cross-entropy loss has converged, the flow sits next to a
manifold of minimizers: its fast modes decay at rates O(1) while the state barely
moves. An explicit solver must keep steps O(1) for stability, so its steps grow
linearly with t (1e4 steps per init to t = 1e5). An L-stable linearly implicit
method steps over the decayed modes and its steps grow geometrically instead.

`Rosenbrock` is ROS34PW2 (Rang & Angermann, BIT 45, 2005): 4 stages, order 3, an
embedded order-2 error estimate, L-stable, stiffly accurate, and a W-method (its
order holds for any matrix W in place of the Jacobian, so rounding in the solve
costs no order). Each step solves (I - h gamma J) k = rhs four times with one
factorization and no Newton iteration, so nothing loops per initialization
inside a vmapped step.

The solve. For `ValueAttention` the state is (M, a): M = V (dim x tokens) on the
"analytic" and "autodiff" paths, M = W (samples x tokens) on the "span" path, and
dM/dt = e s^T where e depends on M only through M s. So the M-block of the
Jacobian is the Kronecker product J_MM[X] = -(H X s) s^T with a small matrix H
(dim x dim or samples x samples), and (I - c J_MM)^(-1) costs one small solve:
u = (I + c |s|^2 H)^(-1) B s, X = B - c (H u) s^T. The tokens block is eliminated by
its Schur complement (tokens x tokens). All blocks come from 2 tokens + rows(M)
Jacobian-vector products of the field itself, so the solve is exact (the same
Jacobian as jax.jacfwd, tested against it) at a cost far below a dense
(dim tokens + tokens)^2 Jacobian and its LU. `Dense` is the generic fallback.

The default (`default_method`): for objectives with a finite minimum (`Square`,
`CrossEntropy`, `SquareLabels` with the `Dense` solve), whose flows become stiff,
Rosenbrock on the linear clock once the horizon is long against the loss's curvature
(`STIFF_HORIZON`), Tsit5 on the linear clock before that; Tsit5 on the log clock for the
logistic objectives, whose loss only decays like 1/t and whose flows stay non-stiff on
that clock.
"""

from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax.flatten_util import ravel_pytree

from ..core._models import ValueAttention
from ..core._objectives import CrossEntropy, Square
from ..core._prompt import SquareLabels
from ..core.fields import AbstractField, Analytic, Autodiff, Span

# ROS34PW2 in the form (I - h g J) k_i = h f(t0 + a_i h, y0 + sum_j A_ij k_j)
#   + h J sum_j G_ij k_j + g_i h^2 df/dt, y1 = y0 + sum_i b_i k_i (Hairer & Wanner IV.7).
_GAMMA = 0.435866521508459
_A = np.array(
    [
        [0.0, 0.0, 0.0, 0.0],
        [0.87173304301691801, 0.0, 0.0, 0.0],
        [0.84457060015369423, -0.11299064236484185, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
    ]
)
_G = np.array(  # strictly lower part of Gamma; its diagonal is _GAMMA
    [
        [0.0, 0.0, 0.0, 0.0],
        [-0.87173304301691801, 0.0, 0.0, 0.0],
        [-0.90338057013044082, 0.054180672388095326, 0.0, 0.0],
        [0.24212380706095346, -1.2232505839045147, 0.54526025533510214, 0.0],
    ]
)
_B = np.array([0.24212380706095346, -1.2232505839045147, 1.5452602553351020, 0.435866521508459])
_B_EMBEDDED = np.array([0.37810903145819369, -0.096042292212423178, 0.5, 0.21793326075422950])


class AbstractStageSolve(eqx.Module):
    """How a Rosenbrock step solves (I - c J) x = b, J the field's Jacobian at the step start."""

    def factor(self, jvp, vjp, y, args, c):
        """A function b -> (I - c J)^(-1) b. `jvp`/`vjp` apply J and J^T at y."""
        raise NotImplementedError


class Dense(AbstractStageSolve):
    """Any state: the dense Jacobian from jvps of the basis, then an LU factorization."""

    def factor(self, jvp, vjp, y, args, c):
        flat, unravel = ravel_pytree(y)
        basis = jnp.eye(flat.size, dtype=flat.dtype)
        columns = jax.vmap(lambda e: ravel_pytree(jvp(unravel(e)))[0])(basis)  # row i = J e_i
        lu = jsl.lu_factor(basis - c * columns.T)
        return lambda b: unravel(jsl.lu_solve(lu, ravel_pytree(b)[0]))


class KroneckerSchur(AbstractStageSolve):
    """State (M, a) with dM/dt = e(M s, a) s^T and s = `weights(y, args)`: see the module docstring.

    Exact when the field has that form (every `ValueAttention` path but "reduced");
    `tests/solve/test_stiff.py` checks it against `Dense`.
    """

    weights: object = eqx.field(static=True)  # (y, args) -> s

    def factor(self, jvp, vjp, y, args, c):
        M, a = y
        rows, tokens = M.shape
        s = self.weights(y, args)
        ss = jnp.dot(s, s)
        inv_ss = jnp.where(ss > 0, 1 / jnp.where(ss > 0, ss, 1), 0)
        zero_M, zero_a = jnp.zeros_like(M), jnp.zeros_like(a)
        # H e_i = -J_MM[e_i s^T / |s|^2] s / |s|^2 (J_MM[X] = -(H X s) s^T).
        unit = jnp.eye(rows, dtype=M.dtype)
        H = jax.vmap(lambda e: -jvp((jnp.outer(e, s) * inv_ss, zero_a))[0] @ s * inv_ss)(unit).T
        small = jsl.lu_factor(jnp.eye(rows, dtype=M.dtype) + c * ss * H)

        def solve_M(B):  # (I - c J_MM)^(-1) B
            u = jsl.lu_solve(small, B @ s)
            return B - c * jnp.outer(H @ u, s)

        # Columns of J for the tokens (jvps) and its tokens rows (vjps).
        unit_a = jnp.eye(tokens, dtype=a.dtype)
        J_Ma, J_aa = jax.vmap(lambda e: jvp((zero_M, e)))(unit_a)  # (tokens, rows, tokens), (tokens, tokens)
        J_aM, _ = jax.vmap(lambda e: vjp((zero_M, e)))(unit_a)  # row j of J_aM: (tokens, rows, tokens)
        Y = jax.vmap(solve_M)(-c * J_Ma)  # A_MM^(-1) A_Ma, one column per token
        A_aM = -c * J_aM
        S = unit_a - c * J_aa.T - jnp.einsum("irt,jrt->ij", A_aM, Y)
        schur = jsl.lu_factor(S)

        def solve(b):
            bM, ba = b
            zM = solve_M(bM)
            xa = jsl.lu_solve(schur, ba - jnp.einsum("irt,rt->i", A_aM, zM))
            return (zM - jnp.einsum("jrt,j->rt", Y, xa), xa)

        return solve


class Rosenbrock(diffrax.AbstractAdaptiveSolver):
    """ROS34PW2: L-stable Rosenbrock-W method of order 3 with an order-2 error estimate.

    Dense output is linear between steps, so pair it with a controller that steps to
    the save times (`controller` does). Works for non-autonomous fields too (the
    df/dt term is included).
    """

    stage_solve: AbstractStageSolve = Dense()

    term_structure: ClassVar = diffrax.AbstractTerm
    interpolation_cls: ClassVar = diffrax.LocalLinearInterpolation

    def order(self, terms):
        return 3

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        h = t1 - t0
        dtype = jnp.result_type(*jax.tree.leaves(y0))
        h = jnp.asarray(h, dtype)

        def field(t, y):
            return terms.vf(t, y, args)

        f0, jvp = jax.linearize(lambda y: field(t0, y), y0)
        vjp = jax.linear_transpose(jvp, y0)
        vjp_one = lambda w: vjp(w)[0]
        dfdt = jax.jvp(lambda t: field(t, y0), (t0,), (jnp.ones_like(t0),))[1]
        solve = self.stage_solve.factor(jvp, vjp_one, y0, args, h * _GAMMA)
        # Python floats, so a float32 flow stays float32.
        combine = lambda coefs, ks: jax.tree.map(
            lambda *k: sum(float(ci) * ki for ci, ki in zip(coefs, k)), *ks
        )
        ks = []
        for i in range(4):
            if i == 0:
                f_i = f0
                rhs = jax.tree.map(lambda f, d: h * f + _GAMMA * h**2 * d, f_i, dfdt)
            else:
                y_i = jax.tree.map(jnp.add, y0, combine(_A[i, :i], ks))
                f_i = field(t0 + float(_A[i, :i].sum()) * h, y_i)
                Jg = jvp(combine(_G[i, :i], ks))
                g_i = float(_G[i, :i].sum()) + _GAMMA
                rhs = jax.tree.map(lambda f, j, d: h * f + h * j + g_i * h**2 * d, f_i, Jg, dfdt)
            ks.append(solve(rhs))
        y1 = jax.tree.map(jnp.add, y0, combine(_B, ks))
        y_error = combine(_B - _B_EMBEDDED, ks)
        dense_info = dict(y0=y0, y1=y1)
        return y1, y_error, dense_info, None, diffrax.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)


def controller(solver, rtol: float, atol: float, save_at=None):
    """The step-size controller `solver` needs, or None for the engine's own PID control.

    A solver whose dense output is only linear (as `Rosenbrock`'s) steps onto the save
    times, so saved states are step ends, not interpolants.
    """
    if save_at is None or solver.interpolation_cls is not diffrax.LocalLinearInterpolation:
        return None
    return diffrax.ClipStepSizeController(diffrax.PIDController(rtol=rtol, atol=atol), step_ts=save_at)


def _flow_weights(y, args):
    model = args[0]  # flow's args are (model, objective, constants)
    return model.norm(y[1])


def stiff_solver(model, field: AbstractField) -> Rosenbrock:
    """`Rosenbrock` with the cheapest exact stage solve for this model and vector field."""
    structured = type(model) is ValueAttention and isinstance(field, Analytic | Span | Autodiff)
    return Rosenbrock(KroneckerSchur(_flow_weights) if structured else Dense())


def stiff_objective(objective) -> bool:
    """True for objectives with a finite minimum, whose flows turn stiff once it is reached."""
    return type(objective) in (Square, CrossEntropy, SquareLabels)


#: Explicit steps to t1 grow like c * lambda * t1 once a flow is stiff (lambda: the loss's
#: largest curvature in beta; measured c = 0.26-0.29 for square loss, 0.14 for
#: cross-entropy), while Rosenbrock takes ~300 steps at any horizon, each about 5x a Tsit5
#: step (benchmarks/RESULTS.md). The default turns stiff once lambda * t1 exceeds this.
STIFF_HORIZON = 5000.0


def default_method(model, objective, field: AbstractField, t1=None):
    """(solver, clock) that `flow` uses when neither is given.

    For `Square` and `CrossEntropy` (stiff after the loss converges): Rosenbrock on the
    linear clock (the log clock would multiply the field by 1 + t and make it stiffer)
    when curvature x t1 > `STIFF_HORIZON`, or when either is not a concrete number
    (under tracing); Tsit5 on the linear clock for shorter horizons, where an explicit
    step costs a fifth of a Rosenbrock step and few are needed. Tsit5 on the log clock
    for the logistic objectives (polarization on a logarithmic clock, no stiffness).
    """
    if not stiff_objective(objective):
        return diffrax.Tsit5(), "log"
    try:
        horizon = float(objective.curvature()) * float(t1)
    except (TypeError, jax.errors.ConcretizationTypeError):
        horizon = np.inf  # unknown here: the method that handles any horizon
    if horizon > STIFF_HORIZON:
        return stiff_solver(model, field), "linear"
    return diffrax.Tsit5(), "linear"
