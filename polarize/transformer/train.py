"""Training many seeds at once: `jax.vmap` over stacked models, `lax.scan` over batches.

Each seed keeps its own parameters, optimizer state, data and shuffling, so seed `s`'s
run is the same whether it trains alone or beside others.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .model import Transformer


def induction_loss(
    model: Transformer, inputs: Int[Array, "b seq"], targets: Int[Array, "b seq"]
) -> Float[Array, ""]:
    """Cross-entropy at the last position + 0.2 x mean cross-entropy at the others."""
    ce = optax.softmax_cross_entropy_with_integer_labels(jax.vmap(model)(inputs), targets)
    return jnp.mean(ce[:, -1] + 0.2 * jnp.mean(ce[:, :-1], axis=1))


def classification_loss(
    model: Transformer, inputs: Int[Array, "b seq"], labels: Int[Array, " b"]
) -> Float[Array, ""]:
    """Cross-entropy of the logits read at the last (CLS) position."""
    logits = jax.vmap(model)(inputs)[:, -1]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def fit(
    models: Transformer,
    loss: Callable,
    data: tuple[Array, Array],
    keys: PRNGKeyArray,
    *,
    lr: float,
    epochs: int,
    batch: int,
    weight_decay: float = 0.01,
    callback: Callable[[int, Array], None] | None = None,
) -> tuple[Transformer, Float[Array, "seeds epochs"]]:
    """Train stacked `models` (leading axis = seeds) with AdamW on per-seed `data`.

    `data` arrays have shape `[seeds, n, ...]`; `keys[seeds]` drive the shuffling. Each
    epoch visits `n // batch` shuffled batches. Returns the models and the mean loss
    per epoch.
    """
    params, static = eqx.partition(models, eqx.is_array)
    opt = optax.adamw(lr, weight_decay=weight_decay)
    state = jax.vmap(opt.init)(params)
    n = data[0].shape[1]
    steps = n // batch

    def one_seed(params, state, x, y, key):
        order = jax.random.permutation(key, n)[: steps * batch].reshape(steps, batch)

        def step(carry, idx):
            p, s = carry
            value, grad = eqx.filter_value_and_grad(lambda p: loss(eqx.combine(p, static), x[idx], y[idx]))(p)
            updates, s = opt.update(grad, s, p)
            return (optax.apply_updates(p, updates), s), value

        (params, state), values = jax.lax.scan(step, (params, state), order)
        return params, state, jnp.mean(values)

    epoch = jax.jit(jax.vmap(one_seed))
    history = []
    for e in range(epochs):
        epoch_keys = jax.vmap(jax.random.fold_in, (0, None))(keys, e)
        params, state, value = epoch(params, state, *data, epoch_keys)
        history.append(value)
        if callback is not None:
            callback(e, value)
    return eqx.combine(params, static), jnp.stack(history, axis=1)


def stack_models(make: Callable[[PRNGKeyArray], Transformer], keys: PRNGKeyArray) -> Transformer:
    """`make(key)` for every key, stacked along a leading seed axis."""
    return eqx.filter_vmap(make)(keys)
