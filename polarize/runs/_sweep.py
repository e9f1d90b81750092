"""The main job: a Monte-Carlo study of polarization over many initializations.

`run_sweep(config, out)` runs a `SweepConfig` (`polarize.config`) in chunks of
initializations, each written to disk as soon as it is finished (`polarize.store`);
`polarize.results` then assembles config.json, summary.json, the per-initialization
arrays and the figures. An interrupted run continues with `resume=True`
(`polarize sweep --resume DIR`), recomputing only missing or damaged chunks; the
result is bit-identical to an uninterrupted run. With several processes
(`jax.distributed`), process p computes the chunks i with i mod P = p.

Per initialization only reduced quantities are kept (`measure`): final statistics
(`polarize.statistics`), hitting times (located on the flow's own accepted steps,
`polarize.hitting.flow_with_hitting_times`) and the logistic rate (`polarize.hitting`),
`ok`/`status`, and `snapshots` log-spaced values of max weight and entropy. A sweep of
model prompt keeps its blocks' trajectories and measures them on the host: max weight
and entropy of the least polarized sample (`measure._selection.weight_statistics`) and
the token selection with its SVMs (`token_selection`, `_selection_arrays`).
"""

import contextlib
import ctypes
import dataclasses
import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..core._batching import cpu_threads
from ..core._choices import BLOCK_SIZE
from ..core._errors import PolarizeError
from ..core._trajectory import Trajectory
from ..core._weights import distribution
from ..figures._pyplot import pyplot
from ..measure._rates import logistic_rate
from ..measure._selection import token_selection, weight_statistics
from ..measure._statistics import final_of_one, final_statistics, order_flags_apply
from ..solve._descent import descend_with_hitting_times
from ..solve._devices import barrier, my_chunks, over_devices
from ..solve._flow import crosses_in_loop, decided
from ..solve._hitting import (
    flow_and_crossings,
    restarted_hitting_times,
)
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
from ._programs import StoredProgram, programs_dir
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
#: itself (JAX, its programs), and per initialization in flight, float64 arrays of the
#: data's size (the field's residuals and the solver's stages) and of the state's. The
#: state's count was 40 when measured; the hitting times' carry has since kept, per
#: target (four by default), the dense output of the step that crossed (9 states for
#: Tsit5) instead of its start and slope (2): 28 more.
BASE_BYTES = 0.7e9
DATA_ARRAYS = 4
STATE_ARRAYS = 68


def memory_estimate(config: SweepConfig, threads: int) -> tuple[float, int]:
    """(bytes, initializations in flight) of a CPU sweep of `config` at its peak, about:
    the process, plus per initialization in flight (`AT_ONCE_CPU` per thread, at most a
    chunk) its data-sized arrays (logistic-data and square hold the residual over every
    sample), its state and, where the sweep keeps trajectories, its saved states."""
    config = config.resolved()
    flight = min(config.inits, config.chunk_size, AT_ONCE_CPU * threads)
    samples = config.data_samples() or 0
    if config.model == "prompt":  # residuals over every token of every sample; state (v, p)
        data, state, saved = samples * config.tokens, 2 * config.dim, 2 * config.dim + samples * config.tokens
    else:
        data, state = samples, (config.dim + 2) * config.tokens
        saved = state
    per_init = DATA_ARRAYS * data + STATE_ARRAYS * state
    if config.method == "gd" or config.objective in ("square", "cross-entropy") or config.model == "prompt":
        per_init += config.n_save * (saved + 2)  # trajectories kept for their statistics
    return BASE_BYTES + 8.0 * flight * per_init, flight


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
    threads = cpu_threads()
    need, flight = memory_estimate(config, threads)
    if need <= available:
        return
    per_init = (need - BASE_BYTES) / flight
    block = config.resolved().block_size
    fits = int((available - BASE_BYTES) // per_init) // block * block
    hint = f"--chunk-size {fits} (the numbers do not depend on it)" if fits >= 1 else "smaller --samples"
    raise PolarizeError(
        f"this sweep needs about {need / 1e9:.1f} GB of memory ({flight} initializations in flight "
        f"on {threads} threads) and {available / 1e9:.1f} GB are available; use {hint}, "
        "or pass --force to run it anyway"
    )


def solve(config: SweepConfig, model, objective) -> Trajectory:
    """The trajectories of `model` (a batch of initializations) under the config's method."""
    return solve_with_times(config, model, objective)[0]


def solve_with_times(config: SweepConfig, model, objective) -> tuple[Trajectory, dict | None]:
    """The trajectories and, for descent or a flow in the engine's batched loop, the config's
    hitting times from the same solve (None otherwise: `measure` then restarts on one device)."""
    if config.method == "flow":
        return flow_and_crossings(model, objective, config.solve_options(), config.time_names())
    # descent checks the targets on the iterates it steps, in the same scan
    levels = dict(levels=config.levels, loss_fraction=config.loss_fraction)
    saves = dict(n_save=config.n_save, block_size=config.resolved().block_size)
    return descend_with_hitting_times(model, objective, config.lr, steps=config.steps, **levels, **saves)


#: Settings that only choose the numbers a sweep starts from (its initializations and
#: data) or what is made of its results afterwards, never the program that solves and
#: measures a piece: `_program` resets them, so that cells of a study that differ only
#: in these (a grid over kappa, v_scale or seed) share one compiled program.
DATA_ONLY = ("kappa", "v_scale", "a_scale", "a_offset", "p_scale", "seed", "inits", "chunk_size", "threshold")


def _program(config: SweepConfig) -> SweepConfig:
    """`config` (its block size resolved) with its `DATA_ONLY` settings at their
    defaults: the key of its programs."""
    defaults = SweepConfig()
    return dataclasses.replace(config.resolved(), **{name: getattr(defaults, name) for name in DATA_ONLY})


@functools.lru_cache(maxsize=16)
def _solved(config: SweepConfig, method: tuple | None = None):
    """The per-device part of `measure` for `config`: one function object per config, so
    the sharded program over several devices is compiled once, not once per chunk.
    `method`: (solver, clock) decided beforehand (see `measure`)."""
    # per-initialization fields only (descent's `steps` are the shared saved step indices)
    fields = ("value_path", "a", "weights", "loss", "ok", "status") + (
        ("steps",) if config.method == "flow" else ()
    )

    # model prompt keeps its trajectories: its token selection is measured on the host
    reduce = _reducer(config) if config.model == "value" else None

    def solved(model, objective):
        if config.method == "flow":
            options, names = _options(config, method), config.time_names()
            result, times = flow_and_crossings(model, objective, options, names, reduce=reduce)
            if times is not None and reduce is not None:  # reduced block by block: no trajectory stored
                return {"reduced": result, "times": times}
            traj = result
        else:
            traj, times = solve_with_times(config, model, objective)
        if config.model == "prompt":
            stats = weight_statistics(traj, keep=config.snapshot_index())
        else:
            stats = final_statistics(traj, objective, keep=config.snapshot_index(), atol=config.atol)
        return {"traj": {k: getattr(traj, k) for k in fields}, "stats": stats, "times": times}

    return solved


@functools.lru_cache(maxsize=16)
def _reducer(config: SweepConfig):
    """What a flow sweep keeps of ONE initialization's trajectory (`solve_flow`'s
    `reduce`): its final statistics, snapshots and logistic rate, as `measure` computes
    them from stored trajectories. One function object per config (a compiled program's key)."""
    keep = tuple(int(k) for k in config.snapshot_index())
    ts, t1, rate = config.times(), config.horizon(), config.fits_rate()

    def reduce(path, a, weights, loss, ok, objective):
        flags = order_flags_apply(objective, path, a)
        b = objective.direction() if flags else jnp.zeros(1, a.dtype)
        out = final_of_one(path, a, weights, loss, ok, b, flags=flags, keep=keep, atol=config.atol)
        if rate:
            fit = logistic_rate(ts, jnp.max(distribution(weights), axis=-1), t1=t1)
            out.update({k: jnp.where(ok, v, jnp.nan) for k, v in fit.items()})
        return out

    return reduce


def measure(config: SweepConfig, model, objective, *, devices=None, method: tuple | None = None) -> dict:
    """Everything a sweep keeps per initialization, for a batch of them (see the module doc).

    The solves, hitting times and statistics are split over `devices`; the numbers do
    not depend on the device count. Hitting times that need restarted solves (solvers
    outside the batched loop) run on one device: their restarted solves' root finding
    rounded differently inside `shard_map`. `method` (solver, clock) replaces the
    config's solver and `flow`'s default clock: what `solve._flow.decided` made of them for this
    sweep's concrete objective (a stored program's trace cannot read its curvature).
    """
    out = over_devices(_solved(_program(config), method), model, objective, devices)
    if "reduced" in out:
        reduced = dict(out["reduced"])
        ok, status, steps = (reduced.pop(k) for k in ("ok", "status", "steps"))
        return {**reduced, **out["times"], "solver_steps": steps, "ok": ok, "status": status}
    parts = out["traj"]
    traj = Trajectory(ts=jnp.asarray(config.times()), V=parts.pop("value_path"), **parts)
    times = out["times"]
    out = dict(out["stats"])
    if config.method == "flow":
        if times is None:
            options, names = config.solve_options(), config.time_names()
            times = restarted_hitting_times(traj, model, objective, options, names)
        out.update(times)
        out["solver_steps"] = traj.steps
    else:  # descent's, NaN where `traj.ok` is False
        out.update(times)
    if config.fits_rate():
        max_weight = jnp.max(distribution(traj.weights), axis=-1)
        rate = logistic_rate(config.times(), max_weight, t1=config.horizon())
        out.update({k: jnp.where(traj.ok, v, jnp.nan) for k, v in rate.items()})
    if config.model == "prompt":
        out.update(_selection_arrays(config, traj, model, objective))
    out["ok"], out["status"] = traj.ok, traj.status
    return out


def _selection_arrays(config: SweepConfig, traj: Trajectory, model, objective) -> dict[str, np.ndarray]:
    """What a prompt sweep keeps of `token_selection` per initialization: each number of
    `TokenSelection.final()` as `final_<name>` (|p| as `final_p_norm`: `norm` is the
    normalization's setting), the selected and best-score tokens `final_selected`,
    `final_best` (inits, samples), and `snap_cos_selected` at the snapshots (float32)."""
    selection = token_selection(traj, model, objective)
    names = {"norm": "p_norm"}
    out = {f"final_{names.get(k, k)}": v for k, v in selection.final().items() if k != "ok"}
    out["final_selected"] = selection.selected.astype(np.int32)
    out["final_best"] = selection.best.astype(np.int32)
    out["snap_cos_selected"] = selection.cos_selected[:, config.snapshot_index()].astype(np.float32)
    return out


def run_chunk(config: SweepConfig, start: int, stop: int, *, devices=None) -> dict[str, np.ndarray]:
    """Per-initialization results for initializations start .. stop - 1, over all local devices.

    The chunk's blocks run a fixed number of initializations at a time for the whole
    sweep (the last run padded with the next initializations), so that each runs one
    compiled program; the numbers do not depend on it. On CPU runs of `AT_ONCE_CPU` go
    side by side to the threads. On a GPU or TPU a run is one block per device: wide
    enough to fill the device, and trajectories a sweep stores (descent, solvers outside
    the batched loop) take no more device memory than the block's solve itself.
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
        stored = _stored_measure(config, model, objective) if n_devices == 1 else None
        out = stored(model, objective) if stored else measure(config, model, objective, devices=devices)
        return {k: np.asarray(v)[: min(lo + size, stop) - lo] for k, v in out.items()}

    starts = list(range(start, stop, size))
    parts = []
    key = (_program(config), size, tuple(devices or ()))
    if key not in _COMPILED:  # the first run alone compiles; the others reuse it
        parts.append(blocks(starts.pop(0)))
        _COMPILED.add(key)
    with ThreadPoolExecutor(threads) as pool:
        parts += list(pool.map(blocks, starts))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _stored_measure(config: SweepConfig, model, objective) -> StoredProgram | None:
    """`measure` of a sweep's config as a stored exported program (`_programs`), where
    the compile cache is on and `measure` is one program with no arithmetic after it (a
    flow reduced block by block in the engine's batched loop): exported whole, it computes
    the same bits. None otherwise (descent, and flows that restart for their hitting
    times, compute their rates and times after their solve: fused into one exported
    program those round differently in the last bit).

    The program is traced with the solver and clock decided here on the concrete
    `objective` (`solve._flow.decided`): traced, the objective's curvature is unknown and `flow`'s
    default would take the stiff method. Decided once per config (data settings
    included: the curvature depends on them), from the first block's `model`."""
    folder = programs_dir()
    if folder is None or config.method != "flow" or config.model != "value":
        return None  # (model prompt measures its token selection on the host: not one program)
    key = (config, folder)
    if key not in _EXPORTABLE:
        options = decided(model, objective, config.solve_options())
        in_loop = crosses_in_loop(model, objective, options)
        _EXPORTABLE[key] = (options.solver, options.clock) if in_loop else None
    method = _EXPORTABLE[key]
    return None if method is None else _stored(_program(config), method, folder)


#: (config, programs folder) -> the (solver, clock) its stored `measure` is traced
#: with, or None where `measure` is not stored (`_stored_measure`).
_EXPORTABLE: dict = {}


def _options(config: SweepConfig, method: tuple | None):
    """The config's flow options, with `method` (solver, clock) in place of its own."""
    options = config.solve_options()
    if method is None:
        return options
    solver, clock = method
    return dataclasses.replace(options, solver=solver, clock=clock)


@functools.lru_cache(maxsize=16)
def _stored(config: SweepConfig, method: tuple, folder: Path) -> StoredProgram:
    settings = {**config.to_dict(), "decided": [type(method[0]).__name__, method[1]]}
    fn = lambda m, o: measure(config, m, o, method=method)
    return StoredProgram(fn, "runs._sweep.measure", settings, folder)


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


#: (config, piece size, devices) whose programs this process has compiled.
_COMPILED: set = set()


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
    process 0 assembles the results (the others return an empty dict). `figures=False`
    skips the four PNGs (`polarize report DIR` draws them from the stored results).
    A CPU sweep that will not fit in memory is refused with its estimate unless `force`
    (`check_memory`). `out` is locked while this process writes it (`_folder.FolderLock`).
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
            config, out, stack, progress=progress, sample=sample, devices=devices, figures=figures
        )


def _run_locked(config: SweepConfig, out: Path, stack, *, progress, sample, devices, figures) -> dict:
    """`run_sweep` once `out` is locked and holds the run's config.json."""
    ranges = chunks(config.inits, config.chunk_size)
    store = ChunkStore(out, ranges, REQUIRED, settings_hash(config))
    todo = [i for i in my_chunks(len(ranges)) if not store.done(i)]
    store.save_if_rebuilt()
    started = time.perf_counter()
    assembler = jax.process_index() == 0
    if assembler and figures:  # the figures' matplotlib (~0.4 s) loads while the solver compiles
        threading.Thread(target=pyplot).start()
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
        for i in todo:
            part = run_chunk(config, *ranges[i], devices=devices)
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
    traj = solve(config, config.build_model(0, n), config.build_objective())
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
