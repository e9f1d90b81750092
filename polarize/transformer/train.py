"""One trainer for every task: AdamW over stacked seeds (`jax.vmap`), `lax.scan` over steps.

A task object (`Induction`, `Classification`) says what the data, the loss, the final
evaluation and the probe recorded during training are; `fit` only trains. Each seed keeps
its own parameters, optimizer state, data and shuffling, so seed `s`'s run is the same
whether it trains alone or beside others.
"""

import abc
import functools
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..measure import sinks
from . import tasks
from .model import Transformer


def _forward(model: Transformer, x: Int[Array, "n seq"]):
    return jax.vmap(model.forward)(x)


class AbstractTask(eqx.Module):
    """What is learned and how it is scored; `fit` and the experiments need nothing else."""

    @property
    @abc.abstractmethod
    def vocab(self) -> int: ...

    @property
    @abc.abstractmethod
    def out_vocab(self) -> int: ...

    @property
    @abc.abstractmethod
    def causal(self) -> bool: ...

    @abc.abstractmethod
    def data(self, key: PRNGKeyArray, n: int) -> tuple[Array, Array]: ...

    @abc.abstractmethod
    def loss(self, model: Transformer, x: Array, y: Array) -> Float[Array, ""]: ...

    @abc.abstractmethod
    def probe(self, model: Transformer, x: Array, y: Array) -> dict[str, Array]:
        """Cheap per-head values recorded every few steps during training."""

    @abc.abstractmethod
    def evaluate(self, model: Transformer, key: PRNGKeyArray, n: int) -> dict[str, Array]:
        """The final metrics of one trained model on `n` fresh test sequences."""


class Induction(AbstractTask):
    """Paper 4.1: predict the token that followed the repeated one.

    Loss = cross-entropy at the last position + `aux_weight` x mean cross-entropy at the
    others. The sink score of a head is `sinks.bos_score` (query rows 1..L-3), averaged
    over the test sequences.
    """

    vocab_size: int = 50
    length: int = 10
    shift_query: bool = True
    aux_weight: float = 0.2

    @property
    def vocab(self) -> int:
        return tasks.induction_vocab(self.vocab_size, self.shift_query)

    @property
    def out_vocab(self) -> int:
        return self.vocab

    @property
    def causal(self) -> bool:
        return True

    def data(self, key, n):
        return tasks.induction(
            key, n, vocab=self.vocab_size, length=self.length, shift_query=self.shift_query
        )

    def loss(self, model, x, y):
        ce = optax.softmax_cross_entropy_with_integer_labels(jax.vmap(model)(x), y)
        return jnp.mean(ce[:, -1]) + self.aux_weight * jnp.mean(ce[:, :-1])

    def probe(self, model, x, y):
        logits, maps = _forward(model, x)
        return dict(
            bos_score=jnp.mean(sinks.bos_score(maps), 0),
            accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y[:, -1]),
        )

    def evaluate(self, model, key, n):
        x, y = self.data(key, n)
        logits, full = _forward(model, x)
        maps = full[..., 1:, :]  # query 0 sees only BOS under causal masking: not informative
        return dict(
            accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y[:, -1]),
            sink_score=jnp.mean(sinks.bos_score(full), 0),
            bos_share=jnp.mean(sinks.bos_share(maps), 0),
            alpha0=jnp.mean(sinks.importance(full)[..., 0], 0),
            sparsity=jnp.mean(sinks.sparsity(maps), 0),
            entropy=jnp.mean(sinks.mean_entropy(maps), 0),
            example=full[0],
        )


class Classification(AbstractTask):
    """Paper 4.2: the group of 10 tokens, read at CLS; plus the single-token attack on
    `pairs` (A, B) pairs of different classes."""

    groups: int = 4
    per_group: int = 10
    length: int = 10
    pairs: int = 500

    @property
    def vocab(self) -> int:
        return self.groups * self.per_group + 1

    @property
    def out_vocab(self) -> int:
        return self.groups

    @property
    def causal(self) -> bool:
        return False

    def data(self, key, n, labels=None):
        return tasks.classification(
            key, n, groups=self.groups, per_group=self.per_group, length=self.length, labels=labels
        )

    def loss(self, model, x, y):
        logits = jax.vmap(model)(x)[:, -1]
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

    def probe(self, model, x, y):
        logits, maps = _forward(model, x)
        return dict(
            sparsity=jnp.mean(sinks.sparsity(maps[..., -1:, :]), 0),
            accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y),
        )

    def evaluate(self, model, key, n):
        kt, ka, kb, kshift, kpos = jax.random.split(key, 5)
        x, y = self.data(kt, n)
        logits, maps = _forward(model, x)
        cls_rows = maps[..., -1:, :]  # [n, layers, heads, 1, keys]
        xa, la = self.data(ka, self.pairs)
        lb = (la + jax.random.randint(kshift, (self.pairs,), 1, self.groups)) % self.groups
        xb, _ = self.data(kb, self.pairs, labels=lb)
        attention_a = jnp.mean(_forward(model, xa)[1][:, -1, :, -1, :], axis=1)  # last layer, heads
        attacked = tasks.single_token_attack(kpos, xa, xb, attention_a)
        pred = jnp.argmax(jax.vmap(model)(attacked)[:, -1], -1)
        pred_b = jnp.argmax(jax.vmap(model)(xb)[:, -1], -1)
        return dict(
            accuracy=jnp.mean(jnp.argmax(logits[:, -1], -1) == y),
            flip_rate=jnp.mean(pred == la),
            clean_b_accuracy=jnp.mean(pred_b == lb),
            sparsity=jnp.mean(sinks.sparsity(cls_rows), 0),
            entropy=jnp.mean(sinks.mean_entropy(cls_rows), 0),
            example=maps[0],
        )


# XLA options on CPU for programs whose run time is small next to their compile time
# (set-up, probes, evaluation, short runs): LLVM at level 0 and the older elemental emitter
# compile the lab's programs 3-8x faster than the defaults, and run them up to ~4x slower.
_FAST_OPTIONS = ({"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False},)
_FAST_OPTIONS += ({"xla_backend_optimization_level": 0},)
# A run that trains on at most this many sequences (steps x batch x seeds) compiles its
# training step with them too: at the small preset's 4,096 (width 16) that saves ~3.5 s of
# compile and costs ~0.7 s of run; longer runs keep XLA's defaults.
FAST_COMPILE_SEQUENCES = 16_384


@functools.cache
def fast_compile_options() -> dict | None:
    """`_FAST_OPTIONS` this jaxlib accepts, on the CPU backend only (else None: defaults)."""
    if jax.default_backend() != "cpu":
        return None
    for options in _FAST_OPTIONS:
        try:
            jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros((), jnp.float32)).compile()
        except Exception:  # an older jax or a renamed XLA option: compile with the defaults
            continue
        return options
    return None


def filter_jit(fun: Callable, fast: bool = True) -> Callable:
    """`eqx.filter_jit(fun)`, compiled with `fast_compile_options()` if `fast`.

    Built on the first call (no XLA backend at import) and kept for the process, so a
    program is compiled once per distinct static input (task, model structure, sizes)
    however many variants, seeds or calls use it.
    """

    @functools.cache
    def jitted(fast: bool):
        options = fast_compile_options() if fast else None
        return eqx.filter_jit(fun, **({} if options is None else {"compiler_options": options}))

    @functools.wraps(fun)
    def call(*args, fast: bool = fast, **kwargs):
        return jitted(fast)(*args, **kwargs)

    return call


def _orders(keys, n: int, epochs: int, batch: int):
    """Per seed, the batch indices of every step: `[seeds, epochs * (n // batch), batch]`."""
    per_epoch = n // batch

    def order(key):
        def one(e):
            return jax.random.permutation(jax.random.fold_in(key, e), n)[: per_epoch * batch]

        return jax.vmap(one)(jnp.arange(epochs)).reshape(epochs * per_epoch, batch)

    return jax.vmap(order)(keys)


def _adamw(lr, weight_decay: float):
    return optax.adamw(lr, weight_decay=weight_decay)


def _opt_init(params, lr, weight_decay: float):
    return jax.vmap(_adamw(lr, weight_decay).init)(params)


def _advance(params, state, x, y, idx, start, stop, lr, task, static, weight_decay: float):
    """Steps `start..stop-1` of every seed; the mean training loss over them.

    `start`, `stop` and `lr` are arrays, so one compiled program serves every block of
    steps, every learning rate and every call with the same task, model and shapes.
    """
    opt = _adamw(lr, weight_decay)

    def block(params, state, x, y, idx):
        def step(i, carry):
            p, s, total = carry
            rows = idx[i]
            loss = lambda p: task.loss(eqx.combine(p, static), x[rows], y[rows])
            value, grad = jax.value_and_grad(loss)(p)
            updates, s = opt.update(grad, s, p)
            return optax.apply_updates(p, updates), s, total + value.astype(total.dtype)

        carry = (params, state, jnp.zeros((), jnp.float32))
        params, state, total = jax.lax.fori_loop(start, stop, step, carry)
        return params, state, total / (stop - start)

    return jax.vmap(block)(params, state, x, y, idx)


def _probe(params, x, y, task, static):
    return jax.vmap(lambda p, px, py: task.probe(eqx.combine(p, static), px, py))(params, x, y)


_orders_jit = filter_jit(_orders)
_opt_init_jit = filter_jit(_opt_init)
_advance_jit = filter_jit(_advance)
_probe_jit = filter_jit(_probe)


def fit(
    models: Transformer,
    task: AbstractTask,
    data: tuple[Array, Array],
    keys: PRNGKeyArray,
    *,
    lr: float,
    epochs: int,
    batch: int,
    weight_decay: float = 0.01,
    record_every: int = 0,
    probe_data: tuple[Array, Array] | None = None,
    callback: Callable[[int, Array], None] | None = None,
) -> tuple[Transformer, dict[str, Array]]:
    """Train stacked `models` (leading axis = seeds) with AdamW on per-seed `data`.

    `data` arrays have shape `[seeds, n, ...]`; `keys[seeds]` drive the shuffling. Each
    epoch visits `n // batch` shuffled batches (a last partial batch is dropped). Every
    `record_every` steps (and at step 0 and the end) `task.probe` runs on the per-seed
    `probe_data`. Returns the models and a history: `step [records]`, `loss
    [seeds, records]` (mean training loss since the previous record; NaN at step 0) and
    each probe value `[seeds, records, ...]`.

    One program trains every block of steps (whatever its length) and one records the
    probe; both are kept for later calls with the same task, model structure and shapes
    (the learning rate is an input, not a constant). A run on at most
    `FAST_COMPILE_SEQUENCES` sequences compiles its training step for compile speed.
    """
    params, static = eqx.partition(models, eqx.is_array)
    rate = jnp.asarray(lr, jnp.float32)
    state = _opt_init_jit(params, rate, weight_decay)
    n = data[0].shape[1]
    per_epoch = n // batch
    total = epochs * per_epoch
    every = record_every if record_every > 0 else per_epoch
    indices = _orders_jit(keys, n, epochs, batch)
    seeds = keys.shape[0]
    fast = total * batch * seeds <= FAST_COMPILE_SEQUENCES
    history: dict[str, list] = {"step": [], "loss": []}

    def record(step, loss):
        history["step"].append(jnp.asarray(step))
        history["loss"].append(loss)
        if probe_data is not None:
            for name, value in _probe_jit(params, *probe_data, task, static).items():
                history.setdefault(name, []).append(value)

    record(0, jnp.full((seeds,), jnp.nan, jnp.float32))
    for start in range(0, total, every):
        stop = min(start + every, total)
        bounds = jnp.asarray(start, jnp.int32), jnp.asarray(stop, jnp.int32)
        params, state, loss = _advance_jit(
            params, state, *data, indices, *bounds, rate, task, static, weight_decay, fast=fast
        )
        record(stop, loss)
        if callback is not None:
            callback(stop, loss)
    out = {k: jnp.stack(v, axis=1) for k, v in history.items() if k != "step"}
    return eqx.combine(params, static), dict(out, step=jnp.stack(history["step"]))


def stack_models(make: Callable[[PRNGKeyArray], Transformer], keys: PRNGKeyArray) -> Transformer:
    """`make(key)` for every key, stacked along a leading seed axis."""
    return eqx.filter_vmap(make)(keys)
