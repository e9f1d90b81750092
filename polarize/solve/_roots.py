"""The one root finder of hitting times: Chandrupatla's method on a bracketed crossing.

A hitting time is where a gap (a level minus the max weight, a loss fraction minus
the loss) first reaches 0 inside one solver step, on the step's dense output. The
batched loop (`_engine._Crossings`) calls `chandrupatla` on the step it recorded;
a restarted solve (`_hitting`, solvers outside the batched loop) hands `Chandrupatla`,
the same iteration as an optimistix root finder, to its diffrax `Event`.

Chandrupatla's method (1997): inverse quadratic interpolation where it is safe,
bisection otherwise, so the bracket always shrinks; stopped when it is narrower than
2 (1e-13 (1 + |t|) + 2 eps |t|), rounding for float64, about 10 evaluations for a
smooth gap where bisection takes 45.
"""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

#: Root-finding iterations at most per crossing (Chandrupatla's method: about 10 for
#: smooth gaps, and never much more than bisection's 45 to rounding).
LOCATE_MAX_ITERATIONS = 100


def _tolerances(dtype):
    eps = jnp.finfo(dtype).eps
    return eps, jnp.maximum(1e-13, 4 * eps)


def _start(lo, hi, f_lo, f_hi, done):
    """The iteration's carry (a, b, c, fa, fb, fc, t, done, i): the first point is the midpoint."""
    half = jnp.asarray(0.5, jnp.result_type(lo))
    return (hi, lo, lo, f_hi, f_lo, f_lo, half, done | ~(hi - lo > 0), jnp.int32(0))


def _step(fx, carry, eps, xtol):
    """The carry after the gap at the current point x = a + t (b - a) was found to be fx."""
    a, b, c_, fa, fb, fc, t, _, i = carry
    x = a + t * (b - a)
    same = jnp.sign(fx) == jnp.sign(fa)
    # keep the bracket [x, b] or [x, a]; c_ is the point dropped
    c_, fc, b, fb = (
        jnp.where(same, a, b),
        jnp.where(same, fa, fb),
        jnp.where(same, b, a),
        jnp.where(same, fb, fa),
    )
    a, fa = x, fx
    xm = jnp.where(jnp.abs(fa) < jnp.abs(fb), a, b)
    fm = jnp.minimum(jnp.abs(fa), jnp.abs(fb))
    tol = 2 * eps * jnp.abs(xm) + xtol * (1 + jnp.abs(xm))
    tlim = tol / jnp.abs(b - c_)
    done = (tlim > 0.5) | (fm == 0)
    xi = (a - b) / (c_ - b)
    phi = (fa - fb) / (fc - fb)
    quadratic = (phi**2 < xi) & ((1 - phi) ** 2 < 1 - xi)
    t_iqi = fa / (fb - fa) * fc / (fb - fc) + (c_ - a) / (b - a) * fa / (fc - fa) * fb / (fc - fb)
    t = jnp.clip(jnp.where(quadratic, t_iqi, 0.5), tlim, 1 - tlim)
    return a, b, c_, fa, fb, fc, t.astype(jnp.result_type(a)), done, i + 1


def _point(carry):
    a, b, _, _, _, _, t, _, _ = carry
    return a + t * (b - a)


def _end_reached(carry):
    """The bracket's end where the gap is >= 0."""
    a, b, _, fa, _, _, _, _, _ = carry
    return jnp.where(fa >= 0, a, b)


def chandrupatla(gap, lo, hi, f_lo, f_hi):
    """The time in [lo, hi] where `gap` reaches 0, given gap(lo) < 0 <= gap(hi)
    (`f_lo`, `f_hi`). Returns the bracket's end where gap >= 0; lo where gap(lo) >= 0
    already, hi where gap(hi) < 0 (rounding may put the root on the step's ends)."""
    eps, xtol = _tolerances(jnp.result_type(lo))
    bad = ~(f_lo < 0) | ~(f_hi >= 0)
    carry = jax.lax.while_loop(
        lambda c: ~c[7] & (c[8] < LOCATE_MAX_ITERATIONS),
        lambda c: _step(gap(_point(c)), c, eps, xtol),
        _start(lo, hi, f_lo, f_hi, bad),
    )
    return jnp.where(~(f_lo < 0), lo, jnp.where(f_hi >= 0, _end_reached(carry), hi))


class _State(eqx.Module):
    carry: tuple
    no_bracket: jax.Array


class Chandrupatla(optx.AbstractRootFinder):
    """`chandrupatla` as an optimistix root finder, for a diffrax `Event` whose condition
    rises through 0 (`direction=True`): options `lower` and `upper` bracket the root.

    Where the condition does not bracket a root (diffrax's lanes without an event,
    whose condition is the distance to `upper`), the root is `upper`.
    """

    rtol: ClassVar[float] = 0.0  # the stopping rule is the method's own (see the module doc)
    atol: ClassVar[float] = 0.0
    norm: ClassVar = staticmethod(jnp.abs)

    def init(self, fn, y, args, options: dict[str, Any], f_struct, aux_struct, tags) -> _State:
        lo = jnp.asarray(options["lower"], f_struct.dtype)
        hi = jnp.asarray(options["upper"], f_struct.dtype)
        f_lo, f_hi = fn(lo, args)[0], fn(hi, args)[0]
        no_bracket = ~(f_lo < 0) | ~(f_hi >= 0)
        return _State(_start(lo, hi, f_lo, f_hi, no_bracket), no_bracket)

    def step(self, fn, y, args, options, state: _State, tags):
        eps, xtol = _tolerances(jnp.result_type(state.carry[0]))
        x = _point(state.carry)
        fx, aux = fn(x, args)
        carry = _step(fx, state.carry, eps, xtol)
        return _point(carry), _State(carry, state.no_bracket), aux

    def terminate(self, fn, y, args, options, state: _State, tags):
        done = state.carry[7] | (state.carry[8] >= LOCATE_MAX_ITERATIONS)
        return done, optx.RESULTS.successful

    def postprocess(self, fn, y, aux, args, options, state: _State, tags, result):
        upper = jnp.asarray(options["upper"], jnp.result_type(state.carry[0]))
        return jnp.where(state.no_bracket, upper, _end_reached(state.carry)), aux, {}
