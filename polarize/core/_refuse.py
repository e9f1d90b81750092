"""Checks of array values that also hold under jit.

A check on a value traced by `jax.jit`, `jax.grad` or `jax.vmap` cannot raise while
tracing; `refuse_if` then attaches `eqx.error_if`, so the same message stops the
computation at run time.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._errors import PolarizeError


def refuse_if(x, bad: Callable, message: str):
    """`x`, refused when `bad(x, xp)` holds anywhere: a `PolarizeError` now if `x` is concrete.

    `bad` computes with the array namespace `xp` it is given. Concrete values in host
    memory (numpy arrays, Python numbers, JAX arrays on the CPU, which numpy reads without
    a copy) are checked with numpy at once: no XLA program to compile per check and
    shape (a fresh process compiled ~20 of them, 20-60 ms each). Concrete values on an
    accelerator are checked there with `jax.numpy`, not copied to the host. When `x` is
    traced (under `jax.jit`, `jax.grad`, `jax.vmap`) the check is attached with
    `eqx.error_if` and stops the computation at run time with the same message; the
    caller must use the returned `x`.
    """
    leaves = jax.tree.leaves(x)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        return eqx.error_if(x, jnp.any(bad(x, jnp)), message)
    if all(_in_host_memory(leaf) for leaf in leaves):
        refused = np.any(bad(jax.tree.map(np.asarray, x), np))
    else:
        with jax.ensure_compile_time_eval():  # concrete values stay concrete inside a trace
            refused = bool(jnp.any(bad(x, jnp)))
    if refused:
        raise PolarizeError(message)
    return x


def _in_host_memory(leaf) -> bool:
    """Whether numpy can read `leaf` without a copy from an accelerator."""
    return not isinstance(leaf, jax.Array) or all(d.platform == "cpu" for d in leaf.devices())


def shown(value) -> str:
    """A value for a message: its repr (a float for a scalar), or "a traced value" under jit/grad/vmap."""
    if isinstance(value, jax.core.Tracer):
        return "a traced value"
    if isinstance(value, int | float) or getattr(value, "ndim", None) == 0:
        return repr(float(value))
    return repr(value)
