"""Batching over initializations: one function written for a single model runs on many.

A model (or objective) holds a batch when its arrays carry one more leading axis
than `core_ndim` says; `over_inits` vmaps exactly those arrays and broadcasts the
rest (a shared target, a normalization's temperature).

Reproducibility: XLA's vectorized code can round differently for different array
shapes (softmax of a batch of 10 and of 1000 differ in the last bit). So the batch
is always cut into blocks of exactly `block_size` initializations (the last one
padded), initialization i at row i % block_size, vmapped inside a block and mapped
sequentially over blocks; a lone block runs as the pass of a loop too, one XLA
cannot inline (inlined, the block was compiled otherwise). Every
initialization then runs the same compiled program whatever the batch size,
chunking or device count, and its numbers are identical bit for bit. Larger
blocks suit accelerators; on CPU a few hundred also keeps lockstep waste of
adaptive solvers small.
"""

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._choices import BLOCK_SIZE, cpu_threads
from ._errors import PolarizeError, check_choice, check_positive

Precision = Literal["float32", "float64"]


def block_size_or_default(block_size: int | None) -> int:
    """`block_size`, checked, or `BLOCK_SIZE` where it is None: the one place the default is decided."""
    return check_positive("block_size", BLOCK_SIZE if block_size is None else block_size, integer=True)


def exact_matmuls(fn):
    """`fn` traced with every matrix product at full precision ("highest").

    On GPUs JAX multiplies float32 matrices in TF32 by default (10 mantissa bits) and on
    TPUs in bfloat16: a vector field evaluated that way is noisier than the solver's
    rtol, and the step-size controller shrinks its steps to chase the noise (measured on
    an H200: logistic data in float32 ran 38x slower than in float64, benchmarks/GPU.md).
    Every jitted entry point of the lab's numerics carries this; float64 is unaffected.
    """

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return traced


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


def float_dtype(model) -> jnp.dtype:
    """The floating dtype the model's trainable arrays share (the dtype of the flow)."""
    return jnp.result_type(*(getattr(model, name) for name in model.trainable))


def batch_axes(module: eqx.Module):
    """An in_axes pytree for `module`: 0 on its batched arrays, None elsewhere."""
    names = [
        name
        for name, nd in type(module).core_ndim.items()
        if getattr(module, name) is not None and getattr(module, name).ndim > nd
    ]
    spec = jax.tree.map(lambda _: None, module)
    if names:
        spec = eqx.tree_at(
            lambda m: [getattr(m, n) for n in names],
            spec,
            [0] * len(names),
            is_leaf=lambda x: x is None,
        )
    return spec


def partition_inits(tree, axes=None) -> tuple:
    """(batched, shared) parts of `tree`: the leaves with the inits axis, and the rest (for `eqx.combine`).

    `axes` is a `jax.vmap` in_axes prefix of `tree` (0 where a subtree is batched);
    default: `batch_axes` of each model or objective in `tree`.
    """
    is_module = lambda x: isinstance(x, eqx.Module)
    if axes is None:
        axes = jax.tree.map(lambda m: batch_axes(m) if is_module(m) else None, tree, is_leaf=is_module)
    is_none = lambda x: x is None
    mask = jax.tree.map(lambda ax, sub: jax.tree.map(lambda _: ax == 0, sub), axes, tree, is_leaf=is_none)
    return eqx.partition(tree, mask)


def ensemble_size(model, objective) -> int | None:
    """The common batch size of model and objective (None if neither is batched)."""
    sizes = {s for s in (model.batch_size, objective.batch_size) if s is not None}
    if len(sizes) > 1:
        raise PolarizeError(
            f"model and objective hold different numbers of initializations: "
            f"{model.batch_size} and {objective.batch_size}"
        )
    return sizes.pop() if sizes else None


def blockwise(fn, tree, *, block_size: int | None = None):
    """fn applied to each initialization of `tree` (leading axis), in fixed blocks.

    `fn` takes and returns single-initialization pytrees. The batch is cut into whole
    blocks of `block_size` (see `block_map`), vmapped inside a block and mapped over
    blocks.
    """
    return block_map(jax.vmap(fn), tree, block_size=block_size)


def block_map(fn, tree, *, block_size: int | None = None):
    """fn applied to whole blocks of `block_size` initializations of `tree` (leading axis).

    Like `blockwise`, but `fn` takes and returns pytrees with a leading axis of exactly
    `block_size` (a batched program written for one block, not vmapped here).

    Initialization i is computed at row i % size of its block, whatever the batch: XLA's
    vectorized loops can round a row by where it falls in the block (on an AVX-512 CPU, a
    matrix-vector product over blocks of 6, rows 4 and 5; a flow at 5 tokens over blocks
    of 4, row 3). So a batch that is not whole blocks is padded to whole blocks with
    copies of its last initialization, and the outputs trimmed (benchmarks/NOTES.md: a
    last block overlapping the one before it, unpadded, gave other last bits at block
    sizes such as 4, 6 or 100). With one block or fewer inits, the inputs are padded to
    one row more than a block and read the same way (`_one_block`).
    """
    n = jax.tree.leaves(tree)[0].shape[0]
    size = block_size_or_default(block_size)
    one_block = n <= size
    pad = lambda k, row: jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[row], k, axis=0)]), tree)
    if one_block:  # padded to one row more than a block, then read and written as any block
        tree = pad(size + 1 - n, slice(0, 1))
    elif n % size:  # padded to whole blocks
        tree = pad(size - n % size, slice(-1, None))
    rows = jax.tree.leaves(tree)[0].shape[0]
    block = lambda start: jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), tree)
    # traced once, for the output shapes and the loop body both (a solver's block program
    # took ~0.6 s to trace, and was traced twice)
    traced = eqx.filter_closure_convert(fn, block(0))
    outs = jax.tree.map(lambda s: jnp.zeros((rows,) + s.shape[1:], s.dtype), traced.out_struct)

    if one_block:
        outs = _one_block(traced, tree, outs, size=size)
    else:
        outs = jax.lax.fori_loop(0, rows // size, _block_pass(traced, tree, size), outs)
    return outs if rows == n else jax.tree.map(lambda x: x[:n], outs)


def _block_pass(traced, tree, size):
    """The loop body of `block_map`: block i of `tree` through `traced`, written into the outputs."""
    rows = jax.tree.leaves(tree)[0].shape[0]

    def one(i, outs):
        start = jnp.minimum(i * size, rows - size)
        block = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), tree)
        put = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x, start, axis=0)
        return jax.tree.map(put, outs, traced(block))

    return one


@eqx.filter_custom_jvp
def _one_block(traced, tree, outs, *, size):
    """`block_map`'s loop for one block, as one pass of a loop whose trip count XLA does not
    see. A loop of one known pass is inlined, and XLA then compiled the block differently
    from a block of a longer loop (a square loss's products went to another library and
    rounded differently): a run of 128 inits differed from the first 128 of 256."""
    trips = jax.lax.optimization_barrier(jnp.int32(1))
    one = _block_pass(traced, tree, size)
    step = lambda c: (c[0] + 1, one(c[0], c[1]))
    return jax.lax.while_loop(lambda c: c[0] < trips, step, (jnp.int32(0), outs))[1]


@_one_block.def_jvp
def _one_block_jvp(primals, tangents, *, size):
    # differentiated: the loop of one known pass (forward and reverse mode both), whose
    # numbers may differ from the undifferentiated ones in the last bits
    loop = lambda traced, tree, outs: jax.lax.fori_loop(0, 1, _block_pass(traced, tree, size), outs)
    return eqx.filter_jvp(loop, primals, tangents)


def over_inits(fn, model, objective, *args, per_init=None, block_size: int | None = None):
    """fn(model, objective, *args) for every initialization (args are shared).

    `per_init`, a pytree whose leaves carry a leading inits axis, is sliced like the
    model and passed as fn(model, objective, per_init_i, *args). Runs in blocks of
    `block_size` (default `BLOCK_SIZE`); see the module docstring.
    """
    if ensemble_size(model, objective) is None:
        return fn(model, objective, *args) if per_init is None else fn(model, objective, per_init, *args)
    dynamic, static = partition_inits((model, objective))

    def one(x):
        dyn, extra = x
        m, o = eqx.combine(dyn, static)
        return fn(m, o, *args) if per_init is None else fn(m, o, extra, *args)

    return blockwise(one, (dynamic, per_init), block_size=block_size)


def in_threads(jitted, model, objective, *args, _block: int, _shared=lambda out: (), **kwargs):
    """`jitted(model, objective, *args, **kwargs)` as chunks of whole blocks run side by side.

    `_block` is the block size `jitted` maps over; `_shared(out)` names the output leaves
    without an inits axis (a trajectory's saved times, say), taken from the first chunk.

    XLA's CPU runtime runs a program's sequential map over blocks on one core, however
    many the machine has. With concrete inputs on CPU and at least two blocks, the
    initializations are cut into `cpu_threads()` chunks of whole blocks (views of the
    inputs' host arrays; the last chunk a copy padded with its last initialization to the
    same shape), each run by the same compiled program in its own thread. Blocks are the
    unchunked run's, so every initialization's numbers are identical to it bit for bit.
    Each thread copies its chunk into its rows of the joined outputs (host buffers that
    JAX then reads without a copy), so joining costs no pass of its own.

    Returns the joined outputs, or None where this does not apply (traced inputs,
    another backend, one core or one block): then call `jitted` directly.
    """
    n = ensemble_size(model, objective)
    workers = cpu_threads()
    blocks = 0 if n is None else -(-n // _block)
    leaves = jax.tree.leaves((model, objective, args, kwargs))
    concrete = not any(isinstance(x, jax.core.Tracer) for x in leaves)
    if workers < 2 or blocks < 2 or not concrete or jax.default_backend() != "cpu":
        return None
    per = -(-blocks // min(workers, blocks)) * _block
    axes = (batch_axes(model), batch_axes(objective))
    is_none = lambda x: x is None

    def chunk(start):
        def take(ax, x):
            if ax is None:
                return x
            rows = np.asarray(x)[start : start + per]  # a view
            if rows.shape[0] < per:  # the last chunk, padded with copies of its last init
                rows = np.concatenate([rows, np.repeat(rows[-1:], per - rows.shape[0], axis=0)])
            return rows

        return jax.tree.map(take, axes, (model, objective), is_leaf=is_none)

    chunks = [chunk(start) for start in range(0, n, per)]
    compiled = jitted.lower(*chunks[0], *args, **kwargs).compile()  # once, cached by JAX
    strip = lambda out: eqx.tree_at(_shared, out, replace_fn=lambda _: None, is_leaf=is_none)
    joined, lock = [], threading.Lock()

    def run(i):
        whole = jax.block_until_ready(compiled(*chunks[i], *args, **kwargs))
        out = strip(whole)
        with lock:  # the first chunk done allocates the joined outputs
            if not joined:
                empty = lambda x: _aligned_empty((n,) + x.shape[1:], x.dtype)
                joined.append(jax.tree.map(empty, out))
        rows = slice(i * per, min((i + 1) * per, n))

        def put(buf, x):
            buf[rows] = np.asarray(x)[: rows.stop - rows.start]

        jax.tree.map(put, joined[0], out)
        return whole if i == 0 else None  # (only the first chunk's shared leaves are kept)

    with ThreadPoolExecutor(len(chunks)) as pool:
        first = list(pool.map(run, range(len(chunks))))[0]
    result = jax.tree.map(jax.dlpack.from_dlpack, joined[0])
    return eqx.tree_at(_shared, result, _shared(first), is_leaf=is_none)


def _aligned_empty(shape, dtype, align: int = 64) -> np.ndarray:
    """np.empty(shape, dtype) starting on an `align`-byte boundary: JAX's CPU client then
    takes it through DLPack without a copy (numpy's own 16-byte alignment is copied)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + align, np.uint8)
    offset = -raw.ctypes.data % align
    return raw[offset : offset + size].view(dtype).reshape(shape)
