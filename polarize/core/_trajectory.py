"""The common result of `flow` and `descend`: states at saved times, per initialization."""

import operator

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._errors import PolarizeError
from ._models import ValueAttention


class ValuePath(eqx.Module):
    """The value matrix at every saved time, stored as V(t) = offset + basis @ coords(t).

    The reduced vector fields move V only inside a fixed subspace: along b for a loss
    of one direction (rank 1), in the data's row span for a dataset loss (rank =
    samples). A trajectory then keeps rank x tokens numbers per saved time instead of
    dim x tokens, and `dense()` rebuilds V exactly when it is asked for. Without
    `basis`, `coords` is V itself (times, dim, tokens). Every leaf carries the inits
    axis of a batched trajectory, so slicing the trajectory slices this too.
    """

    coords: Float[Array, "*inits times rank tokens"]
    offset: Float[Array, "*inits dim tokens"] | None = None
    basis: Float[Array, "*inits dim rank"] | None = None

    @property
    def dtype(self):
        return self.coords.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of `dense()`: (*inits, times, dim, tokens)."""
        if self.basis is None:
            return self.coords.shape
        return self.coords.shape[:-2] + self.basis.shape[-2:-1] + self.coords.shape[-1:]

    def dense(self) -> Float[Array, "*inits times dim tokens"]:
        """V at every saved time."""
        if self.basis is None:
            return self.coords
        step = jnp.einsum("...dr,...trk->...tdk", self.basis, self.coords)
        return self.offset[..., None, :, :] + step

    def at(self, index) -> Float[Array, "*inits dim tokens"]:
        """V at saved time `index` (an int or a traced scalar), without the other times."""
        if self.basis is None:
            return self.coords[..., index, :, :]
        return self.offset + jnp.einsum("...dr,...rk->...dk", self.basis, self.coords[..., index, :, :])

    def project(self, b: Float[Array, "*inits dim"]) -> Float[Array, "*inits times tokens"]:
        """b^T V(t) at every saved time (u = V^T b for a direction b), from the factors."""
        if self.basis is None:
            return jnp.einsum("...tdk,...d->...tk", self.coords, b)
        u0 = jnp.einsum("...dk,...d->...k", self.offset, b)
        along = jnp.einsum("...d,...dr->...r", b, self.basis)
        return u0[..., None, :] + jnp.einsum("...trk,...r->...tk", self.coords, along)

    def apply(self, s: Float[Array, "*inits times tokens"]) -> Float[Array, "*inits times dim"]:
        """V(t) s(t) at every saved time, from the factors."""
        if self.basis is None:
            return jnp.einsum("...tdk,...tk->...td", self.coords, s)
        base = jnp.einsum("...dk,...tk->...td", self.offset, s)
        return base + jnp.einsum("...dr,...trk,...tk->...td", self.basis, self.coords, s)


class Trajectory(eqx.Module):
    """Saved states. Arrays are (inits, times, ...) for a batched model, (times, ...) otherwise.

    `ts` are the times (shared by all initializations): flow time, or steps x lr for
    descent. `V` is the values (U for the tied model) at the saved times, rebuilt on
    access from `value_path` (a `ValuePath`, which the statistics read without
    rebuilding). `status` holds a `polarize.status` code per initialization (OK,
    MAX_STEPS, SOLVER_FAILED, NONFINITE, DIVERGED) and `ok` is `status == OK`.
    `steps` is the step index (descent) or the number of accepted solver steps
    (flow, per initialization).
    """

    ts: Float[Array, " times"]
    value_path: ValuePath
    a: Float[Array, "*inits times logits"]
    weights: Float[Array, "*inits times tokens"]
    loss: Float[Array, "*inits times"]
    ok: Bool[Array, "*inits"]
    status: Int[Array, "*inits"]
    steps: Int[Array, "*inits times"] | Int[Array, "*inits"] | None

    def __init__(self, ts, V, a, weights, loss, ok, status, steps=None):
        """`V`: the values at the saved times, as an array or a `ValuePath`."""
        self.ts = ts
        self.value_path = V if isinstance(V, ValuePath) else ValuePath(coords=V)
        self.a, self.weights, self.loss, self.ok, self.status, self.steps = (
            a,
            weights,
            loss,
            ok,
            status,
            steps,
        )

    @property
    def V(self) -> Float[Array, "*inits times dim tokens"]:
        """The values at every saved time (built from `value_path`)."""
        return self.value_path.dense()

    @property
    def batched(self) -> bool:
        return self.ok.ndim == 1

    def at(self, i: int) -> "Trajectory":
        """Initialization i of a batched trajectory (-n <= i < n, as for a list)."""
        if not self.batched:
            raise PolarizeError("`at` takes an initialization of a batched trajectory; this one holds one")
        n = self.ok.shape[0]
        if isinstance(i, jax.core.Tracer):
            i = eqx.error_if(i, (i < -n) | (i >= n), f"`i` must be an initialization in -{n}..{n - 1}")
        elif not -n <= operator.index(i) < n:
            raise PolarizeError(f"`i` must be an initialization in -{n}..{n - 1}; got {i}")
        return jax.tree.map(lambda x: x if x is self.ts else x[i], self)

    def final(self, model):
        """The model at the last saved time (batched like the input model)."""
        return model.at_state(self.value_path.at(-1), self.a[..., -1, :])

    @property
    def p(self) -> Float[Array, "*inits times dim"]:
        """The prompt vector p of a `PromptAttention` flow at every saved time (kept as `a`)."""
        return self.a

    @property
    def v(self) -> Float[Array, "*inits times dim"]:
        """The value vector v of a `PromptAttention` flow at every saved time (kept as the
        one column of `V`; constant for `train="p"`)."""
        return self.value_path.coords[..., 0]


#: Numbers of an objective's data that the observation of one initialization's saved
#: states spans at once (a block holds `block_size` initializations): past it, the saved
#: states are observed a few at a time. Evaluated all at once, a block's losses at 64
#: saved times over 50,000 samples were a 3.3 GB array (a sweep of 256 inits: peak 7.1 GB,
#: 81 s; a few at a time: 0.9 GB, 16 s), and 200,000 samples asked XLA for 26 GB.
OBSERVE_BUDGET = 2**16


def saved_at_once(n: int, data: int) -> int:
    """Of `n` saved states, how many are observed at once where the objective's largest
    array holds `data` numbers: all of them, unless that passes `OBSERVE_BUDGET`."""
    return min(n, max(1, OBSERVE_BUDGET // max(data, 1)))


def over_saved(f, xs, objective):
    """`jax.vmap(f)(xs)` over saved states, `saved_at_once` of them at a time (its data:
    `objective`'s largest array); all at once, the same program as the plain vmap."""
    n = jax.tree.leaves(xs)[0].shape[0]
    data = max((leaf.size for leaf in jax.tree.leaves(objective) if hasattr(leaf, "size")), default=1)
    at_once = saved_at_once(n, data)
    if at_once >= n:
        return jax.vmap(f)(xs)
    return jax.lax.map(f, xs, batch_size=at_once)


def observe(model, objective, path: ValuePath, a) -> tuple:
    """Weights and loss of one initialization at every saved time (times first).

    A factored `path` (a `ValueAttention` in reduced coordinates) gives beta = V(t) s(t)
    from its factors; otherwise the model is rebuilt at each time.
    """
    if path.basis is not None and isinstance(model, ValueAttention):
        weights = jax.vmap(model.norm)(a)
        return weights, over_saved(objective, path.apply(weights), objective)

    def at_time(p):
        m = model.at_state(*p)
        return m.weights(), objective(m())

    return over_saved(at_time, (path.dense(), a), objective)


def all_finite(tree) -> Bool[Array, ""]:
    """True when every array in `tree` is finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
