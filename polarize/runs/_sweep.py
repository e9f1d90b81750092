"""The main job: a Monte-Carlo study of polarization over many initializations.

`run_sweep(config, out)` runs a `SweepConfig` (`polarize.config`) in chunks of
initializations, each written to disk as soon as it is finished (`polarize.store`);
`polarize.results` then assembles config.json, summary.json, the per-initialization
arrays and the figures. An interrupted run continues with `resume=True`
(`polarize sweep --resume DIR`), recomputing only missing or damaged chunks; the
result is bit-identical to an uninterrupted run. With several processes
(`jax.distributed`), process p computes the chunks i with i mod P = p.

Per initialization only reduced quantities are kept (`_numerics.measure`): final statistics
(`polarize.statistics`), hitting times (located on the flow's own accepted steps,
`polarize.hitting.flow_with_hitting_times`) and the logistic rate (`polarize.hitting`),
`ok`/`status`, and `snapshots` log-spaced values of max weight and entropy. A sweep of
model prompt keeps its blocks' trajectories and measures them on the host: max weight
and entropy of the least polarized sample (`measure._selection.weight_statistics`) and
the token selection with its SVMs (`token_selection`, `_selection_arrays`).
"""

import contextlib
import ctypes
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np

from ..core._choices import BLOCK_SIZE, cpu_threads
from ..core._errors import PolarizeError
from ..core._trajectory import saved_at_once
from ..solve._devices import barrier, my_chunks
from ._config import SweepConfig
from ._folder import (
    FolderLock,
    check_out,
    check_same,
    make_folder,
    package_versions,
    prepare_out,
    remove_interrupted_writes,
    resumed_config,
    settings_hash,
    stored_config,
)
from ._results import Gather, assemble, gathering
from ._storage import write_json
from ._store import ChunkStore

#: A sweep has two granularities: the chunk (the unit on disk, `chunk_size`) and the block
#: (the unit of the numerics, `block_size`). Threads and devices are only where blocks
#: run: on CPU a chunk's blocks go to the threads this many initializations at a time
#: (whole blocks). Where a sweep stores trajectories (solvers outside the batched loop,
#: descent), they exist only for these, so memory does not grow with `chunk_size`. A
#: default flow sweep stores none; there 2048 at a time ran 12-15% faster than 1024 on two
#: threads (a 3e5 sweep, two runs each), and 4096 no faster. On a GPU or TPU each device
#: takes one block at a time (see `run_chunk`).
AT_ONCE_CPU = 16 * BLOCK_SIZE


#: Memory of a CPU sweep, measured (benchmarks/NOTES.md, "Memory estimate"): the process
#: itself (JAX, its programs: 0.33 GB for 128 toy inits); per initialization in flight,
#: about 100 float64 arrays of the state's size (the solver's stages, the hitting times'
#: carry, the per-init results; 65 KB at T = d = 8) and, for model prompt, 9 over every
#: token of every sample plus 2 per saved state; per block in flight, where the objective
#: holds data, 4 arrays over every sample per initialization (the residuals) and, per
#: saved state it observes at once (`observed_at_once`), 2 more (the loss over every sample:
#: XLA's buffer of two arrays).
BASE_BYTES = 0.35e9
STATE_ARRAYS = 100
DATA_ARRAYS = 4
PROMPT_DATA_ARRAYS = 9
SAVED_LOSS_ARRAYS = 2


def observed_at_once(config: SweepConfig) -> int:
    """How many saved states a block of `config` observes at once
    (`core._trajectory.saved_at_once`; the objective's largest array is X, samples x dim)."""
    config = config.resolved()
    return saved_at_once(config.n_save, (config.data_samples() or 0) * config.dim)


def memory_estimate(config: SweepConfig, threads: int, flight: int | None = None) -> tuple[float, int]:
    """(bytes, initializations in flight) of a CPU sweep of `config` at its peak, about:
    the process, plus per initialization in flight (`AT_ONCE_CPU` per thread, at most a
    chunk, or `flight`) its state, model prompt's data-sized arrays and, where the sweep
    keeps trajectories, its saved states; plus, per block in flight, its arrays over the
    objective's data."""
    config = config.resolved()
    if flight is None:
        flight = min(config.inits, config.chunk_size, AT_ONCE_CPU * threads)
    block = config.block_size
    blocks = min(threads, -(-flight // block))
    samples = config.data_samples() or 0
    need = BASE_BYTES
    if config.model == "prompt":  # arrays over every token of every sample; state (v, p)
        data, state = samples * config.tokens, 2 * config.dim
        saved = state + 2 * data  # a saved state's weights and their scores, per sample
        per_init = PROMPT_DATA_ARRAYS * data + STATE_ARRAYS * state
    else:
        state = saved = (config.dim + 2) * config.tokens
        per_init = STATE_ARRAYS * state
        need += 8.0 * blocks * block * (DATA_ARRAYS + SAVED_LOSS_ARRAYS * observed_at_once(config)) * samples
    if config.method == "gd" or config.objective in ("square", "cross-entropy") or config.model == "prompt":
        per_init += config.n_save * (saved + 2)  # trajectories kept for their statistics
    return need + 8.0 * flight * per_init, flight


def largest_buffer(config: SweepConfig) -> float:
    """Bytes of a sweep's largest single allocation, about, where it grows with the data:
    a block's losses over every sample at the saved states it observes at once (0 where
    the objective holds no data)."""
    config = config.resolved()
    samples = config.data_samples() or 0
    if config.model == "prompt" or not samples:
        return 0.0
    return 8.0 * SAVED_LOSS_ARRAYS * config.block_size * observed_at_once(config) * samples


def _available_memory() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return float(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None  # not Linux: no check


def check_memory(config: SweepConfig, *, force: bool = False) -> None:
    """Refuse, with the estimate, a CPU sweep that will not fit in the memory available
    (`memory_estimate`), unless `force`; where it would fit with fewer initializations in
    flight, say which --chunk-size does (the chunk size never changes the numbers)."""
    available = _available_memory()
    if force or available is None or jax.default_backend() != "cpu":
        return
    buffer = largest_buffer(config)
    if buffer > available:
        raise PolarizeError(
            f"this sweep needs one buffer of about {buffer / 1e9:.1f} GB and {available / 1e9:.1f} GB "
            "are available (a block's losses over every sample); use fewer --samples, or pass "
            "--force to run it anyway"
        )
    threads = cpu_threads()
    need, flight = memory_estimate(config, threads)
    if need <= available:
        return
    block = config.resolved().block_size
    fits = next(
        (
            n
            for n in range(flight // block * block, 0, -block)
            if memory_estimate(config, threads, n)[0] <= available
        ),
        None,
    )
    if fits is not None:
        hint = f"--chunk-size {fits} (the numbers do not depend on it)"
    elif config.data_samples():
        hint = "fewer --samples (a block's losses span every sample)"
    else:
        hint = "fewer --n-save or a smaller model"
    raise PolarizeError(
        f"this sweep needs about {need / 1e9:.1f} GB of memory ({flight} initializations in flight "
        f"on {threads} threads) and {available / 1e9:.1f} GB are available; use {hint}, "
        "or pass --force to run it anyway"
    )


def run_chunk(
    config: SweepConfig, start: int, stop: int, *, devices=None, first_alone: bool = True
) -> dict[str, np.ndarray]:
    """Per-initialization results for initializations start .. stop - 1, over all local devices.

    The chunk's blocks run a fixed number of initializations at a time for the whole
    sweep (the last run padded with the next initializations), so that each runs one
    compiled program, from the whole block that holds `start`; the numbers do not
    depend on it. On CPU runs of `AT_ONCE_CPU` go
    side by side to the threads. On a GPU or TPU a run is one block per device: wide
    enough to fill the device, and trajectories a sweep stores (descent, solvers outside
    the batched loop) take no more device memory than the block's solve itself.
    `first_alone`: the first run goes before the others, so that it alone compiles
    their program (a sweep's first chunk; later chunks reuse it).
    """
    config = config.resolved()
    objective = _objective(config)
    n_devices = len(devices or jax.local_devices())
    # XLA's CPU runtime runs a program on one core: on one CPU device, runs of blocks go
    # side by side to `cpu_threads()` threads (the same programs, so the same numbers)
    one_cpu = jax.default_backend() == "cpu" and n_devices == 1
    threads = cpu_threads() if one_cpu else 1
    size = piece_size(config, n_devices)

    def blocks(lo):  # initializations lo .. lo + size - 1, whole blocks
        model = config.build_model(lo, lo + size)
        out = _numerics().measure(config, model, objective, devices=devices)
        return {k: np.asarray(v)[: min(lo + size, stop) - lo] for k, v in out.items()}

    # runs start on the sweep's whole blocks, so that init i sits at row i % block_size of
    # its block whatever the chunk size (XLA rounds a row by where it falls in a block);
    # the rows before `start` are computed and dropped
    base = start - start % config.block_size
    starts = list(range(base, stop, size))
    parts = [blocks(starts.pop(0))] if first_alone else []
    with ThreadPoolExecutor(threads) as pool:
        parts += list(pool.map(blocks, starts))
    return {k: np.concatenate([p[k] for p in parts])[start - base :] for k in parts[0]}


def _numerics():
    """The module of a sweep's solve and measurements (`_numerics`: diffrax, optax),
    imported on first use: reading a finished run (`pz.load`, `polarize report`) needs
    neither."""
    from . import _numerics

    return _numerics


def piece_size(config: SweepConfig, n_devices: int = 1) -> int:
    """How many initializations a run of blocks of `config` holds (see `run_chunk`)."""
    config = config.resolved()
    at_once = AT_ONCE_CPU if jax.default_backend() == "cpu" else config.block_size * n_devices
    return _round_up(min(at_once, config.chunk_size, config.inits), config.block_size)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@functools.lru_cache(maxsize=4)
def _objective(config: SweepConfig):
    """The sweep's objective, built once (~20 ms, mostly its checks), not once per chunk."""
    return config.build_objective()


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[(start, stop), ...] covering range(n) in chunks of at most `size`."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


REQUIRED = ("ok", "status", "final_max_weight", "final_entropy", "snap_max_weight", "start", "stop")


def run_sweep(
    config: SweepConfig,
    out,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
    sample: int = 0,
    devices=None,
    figures: bool = True,
    force: bool = False,
) -> dict:
    """Run (or resume) a sweep in `out`; returns the summary (also in summary.json).

    Finished chunks are on disk as soon as they are done, so an interrupted run
    loses at most the chunk in flight. With several JAX processes
    (`jax.distributed.initialize()` first), each computes its share of chunks and
    process 0 assembles the results (the others return an empty dict). The four PNGs
    are drawn once the results are on disk; `figures=False` skips them (`polarize report
    DIR` draws them from the stored results). A CPU sweep that will not fit in memory is
    refused with its estimate unless `force` (`check_memory`). `out` is locked while this
    process writes it (`_folder.FolderLock`).
    """
    if sample < 0:
        raise PolarizeError(f"`sample` must be >= 0; got {sample}")
    cpu_threads()  # a bad POLARIZE_THREADS is refused before anything is written
    jax.config.update("jax_enable_x64", True)  # sweeps are float64 throughout
    out = Path(out)
    if resume:
        config = resumed_config(config, out)
        check_same(stored_config(out), config, out)
    else:
        config = config.resolved()  # the block size is part of the numbers: stored resolved
        if jax.process_index() == 0:
            check_out(out, overwrite)  # refused before a lock file is made in a folder not ours
    check_memory(config, force=force)
    with contextlib.ExitStack() as stack:
        # every process locks the folder (its own lock file) before anything is read or written
        if jax.process_index() == 0 or resume:
            make_folder(out)
        barrier("polarize-sweep-folder")
        stack.enter_context(FolderLock(out, jax.process_index(), jax.process_count()))
        if jax.process_index() == 0:
            if resume:
                remove_interrupted_writes(out)
            else:
                prepare_out(out, overwrite)
                write_json(out / "config.json", {"sweep": config.to_dict(), "versions": package_versions()})
        barrier("polarize-sweep-start")
        return _run_locked(
            config,
            out,
            stack,
            progress=progress,
            sample=sample,
            devices=devices,
            figures=figures,
        )


def _run_locked(config: SweepConfig, out: Path, stack, *, progress, sample, devices, figures) -> dict:
    """`run_sweep` once `out` is locked and holds the run's config.json."""
    ranges = chunks(config.inits, config.chunk_size)
    store = ChunkStore(out, ranges, REQUIRED, settings_hash(config))
    todo = [i for i in my_chunks(len(ranges)) if not store.done(i)]
    store.save_if_rebuilt()
    started = time.perf_counter()
    assembler = jax.process_index() == 0
    bar = _progress(progress, ranges, todo)
    # process 0 gathers its chunks for the assembly as they are finished
    gather = Gather(config.inits, stack.enter_context(gathering(out))) if assembler else None

    def finish(i, part):  # on disk, gathered, then the chunk's memory handed back
        store.write(i, part)
        if gather is not None:
            gather.add(i, ranges[i][0], part)
        _release_free_memory()
        if bar is not None:
            bar.update(ranges[i][1] - ranges[i][0])

    # chunk i is written while chunk i + 1 is computed (writing and trimming memory took
    # ~25 ms a chunk with the solver threads idle); an interrupt still waits for the write
    with ThreadPoolExecutor(1) as writer:
        written = None
        for n, i in enumerate(todo):
            part = run_chunk(config, *ranges[i], devices=devices, first_alone=n == 0)
            if written is not None:
                written.result()  # a failed write stops the sweep here
            written = writer.submit(finish, i, part)
        if written is not None:
            written.result()
    if bar is not None:
        bar.close()
    barrier("polarize-sweep-chunks")
    if not assembler:
        return {}
    _complete(config, store, gather)
    wall = time.perf_counter() - started
    recomputed = {store.path(i).name: why for i, why in sorted(store.problems.items())}
    return assemble(
        config, out, gather, wall=wall, sample=_sample(config, sample), figures=figures, recomputed=recomputed
    )


def _complete(config: SweepConfig, store: ChunkStore, gather: Gather) -> None:
    """Gather every chunk this process did not compute: read from disk (a resumed run's,
    other processes'), or computed here where one went missing."""
    for i, (start, stop) in enumerate(store.ranges):
        if i in gather.done:
            continue
        part = store.read(i)
        if part is None:
            part = run_chunk(config, start, stop)
            store.write(i, part)
        gather.add(i, start, part)
        del part


def _sample(config: SweepConfig, sample: int) -> dict | None:
    """Full trajectories of the first `sample` initializations (sample.npz), or None."""
    if not sample:
        return None
    n = min(sample, config.inits)
    traj = _numerics().solve(config, config.build_model(0, n), config.build_objective())
    states = ("p", "v") if config.model == "prompt" else ("V", "a")
    return {k: getattr(traj, k) for k in ("ts", *states, "weights", "loss", "ok", "status")}


def _release_free_memory() -> None:
    """Hand memory freed by the last chunk back to the system (glibc keeps it otherwise:
    compiling the first chunk's program alone leaves ~300 MB of free heap that a 1e6
    sweep's peak memory then counted). A no-op where the C library is not glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # no libc.so.6, or one without malloc_trim
        return
    trim(0)


def _progress(enabled: bool, ranges, todo):
    if not enabled:
        return None
    from tqdm import tqdm

    total = sum(b - a for a, b in ranges)
    remaining = sum(ranges[i][1] - ranges[i][0] for i in todo)
    return tqdm(
        total=total, initial=total - remaining, unit="init", unit_scale=True, desc="sweep", smoothing=0.1
    )
