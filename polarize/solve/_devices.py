"""Using every device and every process JAX is given, with JAX's own machinery only.

- Devices: a batch of initializations is split over the local devices with
  `jax.shard_map`; each device runs its own adaptive solver loop on its share
  (no lockstep across devices) through the same fixed-block program, so results
  are bit-identical for any device count. On CPU, try it with
  `XLA_FLAGS=--xla_force_host_platform_device_count=2`.
- Processes: after `jax.distributed.initialize()`, process p of P takes the
  chunks whose index is p mod P (`my_chunks`); a barrier
  (`multihost_utils.sync_global_devices`) lets process 0 assemble the results.
- Compilation cache: the CLI keeps compiled programs in JAX's persistent cache
  (`cache_dir()`), so repeated calls skip recompilation; `enable_compilation_cache`
  (public as `pz.enable_compilation_cache`) turns it on, for a notebook or a script too.
- Compiled programs in memory: `release_programs_if_crowded` drops JAX's in-memory
  programs before a process runs out of memory maps (Linux's per-process limit).
"""

import functools
import hashlib
import os
import platform
import threading
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh, PartitionSpec

from ..core._batching import partition_inits
from ..core._errors import PolarizeError

AXIS = "inits"


def over_devices(fn, model, objective, devices=None, *, block_size: int = 1):
    """fn(model, objective) on a batched model, its initializations split over devices.

    `fn` must return a pytree of arrays whose leading axis is the initialization.
    The objective is shared (replicated) unless it is batched like the model. Each
    device's share is whole blocks of `block_size` (the blocks `fn` maps over), so that
    initialization i sits at the same row of its block whatever the device count.
    With several devices the results come back as host (numpy) arrays. The sharded
    program is compiled once per `fn`, devices, shapes and static settings, and reused
    on later calls (pass the same `fn` object, e.g. a cached closure).
    """
    devices = tuple(devices or jax.local_devices())
    n = model.batch_size
    if n is None:
        raise ValueError("over_devices needs a batched model")
    if len(devices) == 1:
        return fn(model, objective)
    k = len(devices)
    per = -(-n // (k * block_size)) * block_size
    # arrays travel as inputs (batched ones split, the rest replicated); what is left is
    # static and keys the compiled program
    split, rest = partition_inits((model, objective))
    shared, static = eqx.partition(rest, eqx.is_array)
    # arrays a program left committed to other devices (a program's outputs, on device 0)
    # would be refused by the devices' program: host copies of those only
    elsewhere = lambda x: isinstance(x, jax.Array) and x.committed and x.sharding.device_set != set(devices)
    shared = jax.tree.map(lambda x: np.asarray(x) if elsewhere(x) else x, shared)

    def pad(x):  # pad with copies of initialization 0: valid numbers, sliced off below
        x = np.asarray(x)
        return np.concatenate([x, np.repeat(x[:1], per * k - n, axis=0)])

    try:
        run = _sharded(fn, static, devices)
    except TypeError:  # static settings that cannot be hashed: build the program afresh
        run = _sharded.__wrapped__(fn, static, devices)
    out = run(jax.tree.map(pad, split), shared)
    # gathered to the host: later work then runs on one device, not SPMD over all
    return jax.tree.map(lambda x: np.asarray(x)[:n], out)


@functools.lru_cache(maxsize=32)
def _sharded(fn, static, devices):
    """jit(shard_map(fn)) over `devices`: split inputs by initialization, shared ones replicated."""

    def local(split, shared):
        m, o = eqx.combine(split, shared, static)
        return fn(m, o)

    mesh = Mesh(np.array(devices), (AXIS,))
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(PartitionSpec(AXIS), PartitionSpec()),
        out_specs=PartitionSpec(AXIS),
        check_vma=False,
    )
    return jax.jit(sharded)


#: Environment variables by which JAX (or polarize) finds the other processes.
COORDINATOR_ENV = ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")


def start_distributed() -> None:
    """`jax.distributed.initialize()`, from SLURM, Open MPI or plain environment variables.

    JAX detects SLURM and Open MPI itself. Without them, `JAX_COORDINATOR_ADDRESS`
    (host:port of process 0), `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` name the
    processes (JAX reads only the first; the other two are passed on here).
    """

    if not any(os.environ.get(k) for k in COORDINATOR_ENV):
        raise PolarizeError(
            "`--distributed` needs a coordinator: set JAX_COORDINATOR_ADDRESS (host:port), "
            "JAX_NUM_PROCESSES and JAX_PROCESS_ID, or launch under SLURM (srun) or Open MPI (mpirun)"
        )
    options = {}
    for name, key in (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID")):
        value = os.environ.get(key)
        if value is not None:
            try:
                options[name] = int(value)
            except ValueError:
                raise PolarizeError(f"`{key}` must be an integer; got {value!r}") from None
    try:
        jax.distributed.initialize(os.environ.get("JAX_COORDINATOR_ADDRESS"), **options)
    except (ValueError, RuntimeError) as e:
        raise PolarizeError(f"`--distributed`: jax.distributed.initialize() failed: {e}") from None


def my_chunks(n_chunks: int) -> list[int]:
    """The chunk indices this process computes: i with i mod process_count == process_index."""
    return [i for i in range(n_chunks) if i % jax.process_count() == jax.process_index()]


def barrier(name: str) -> None:
    """Wait for every process (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def cache_dir() -> Path | None:
    """Where the CLI keeps what it compiled: $POLARIZE_CACHE_DIR or ~/.cache/polarize.

    Inside it, `jax/` is JAX's persistent compilation cache, one folder per kind of CPU
    (`host_cpu`); deleting the folder empties it. None (no persistent cache) when
    POLARIZE_NO_CACHE is set to a non-empty value.
    """
    if os.environ.get("POLARIZE_NO_CACHE"):
        return None
    return Path(os.environ.get("POLARIZE_CACHE_DIR", Path.home() / ".cache" / "polarize"))


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Keep what JAX compiles in a folder on disk, so that a later process (a new notebook
    kernel, the next script, the `polarize` command) loads each program of the same shapes
    and settings instead of compiling it again. Returns the folder, or None where the
    default folder is turned off (`POLARIZE_NO_CACHE`; nothing is changed then).

    `path`: the folder, created if missing; by default the CLI's, `$POLARIZE_CACHE_DIR` or
    `~/.cache/polarize`. Inside it, `jax/` holds JAX's own persistent compilation cache,
    here for every program however quick its compile, in one subfolder per kind of CPU
    (`host_cpu`). Process-wide, like JAX's setting
    it turns on; a call with another folder moves the cache there. The numbers are the
    same with the cache or without (on a CPU; tests/solve/test_compilation_cache.py)."""
    if path is not None and not isinstance(path, str | os.PathLike):
        raise PolarizeError(f"`path` must be a folder's path (a str or a path) or None; got {path!r}")
    root = cache_dir() if path is None else Path(path)
    if root is None:
        return None
    root = root.absolute()  # a later change of the working folder does not move it
    folder = root / "jax" / host_cpu()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        named = "`path`" if path is not None else "`POLARIZE_CACHE_DIR` (or the default, ~/.cache/polarize)"
        off = "" if path is not None else "; POLARIZE_NO_CACHE=1 turns the cache off"
        raise PolarizeError(
            f"{named} must be a folder that can be created: {root} ({e.strerror}){off}"
        ) from None
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # every program, the ~40 small ones too (argument checks, key derivation, the draws'
    # scaling, run op by op: 10-70 ms each to compile, ~1 s per process together)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if before not in (None, str(folder)):  # JAX opens its cache once: reopen it in the new folder
        compilation_cache.reset_cache()
    return root


#: what /proc/cpuinfo says of a CPU's kind: x86's vendor, family, model and flags (a virtual
#: machine's model name may be only "AMD EPYC"), Arm's implementer, part and features
CPU_FIELDS = (
    "vendor_id",
    "cpu family",
    "model",
    "model name",
    "flags",
    "CPU implementer",
    "CPU part",
    "Features",
)


@functools.cache
def host_cpu() -> str:
    """This machine's kind of CPU, as a folder name: its architecture and a digest of its
    model and instruction-set flags (Linux's /proc/cpuinfo; elsewhere what `platform`
    says). XLA compiles a CPU program for the instruction set of the CPU it runs on, and a
    compiled program stored on a machine with AVX-512 still loads on one without (XLA only
    logs that it may end in SIGILL), so machines that share a home folder keep their
    compiled programs apart."""
    try:
        with open("/proc/cpuinfo") as info:
            return cpu_kind(info.read())
    except OSError:
        return cpu_kind(None)


def cpu_kind(cpuinfo: str | None) -> str:
    """`host_cpu`'s name from the text of /proc/cpuinfo (None: what `platform` says): only
    the fields of `CPU_FIELDS` of its first processor, not those that change from one
    reading to the next (its clock, `cpu MHz`)."""
    if cpuinfo is None:
        ident = platform.processor()
    else:
        first = cpuinfo.split("\n\n", 1)[0]  # the first processor's lines
        fields = dict(map(str.strip, line.split(":", 1)) for line in first.splitlines() if ":" in line)
        ident = "|".join(fields.get(k, "") for k in CPU_FIELDS)
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def mapped_regions() -> int | None:
    """How many memory regions this process has mapped (the lines of /proc/self/maps);
    None where the system does not say (not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return None


def map_limit() -> int:
    """The kernel's limit of mapped regions per process (vm.max_map_count; 65530 if unread)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


def release_programs_if_crowded(*args, fraction: float = 0.75, limit: int | None = None) -> bool:
    """`jax.clear_caches()` once this process has mapped `fraction` of `limit` (default
    `map_limit()`) memory regions; True if it did.

    XLA's CPU code takes a few mapped regions per compiled program, and JAX keeps every
    program it compiled alive in its caches: a flow and its summary at a new shape add
    about 700. At Linux's default limit of 65530 the next compile dies with a
    segmentation fault (about 90 shapes in one process; the test suite in one worker
    got there). Past the mark the programs are dropped and compile again (or load from
    the persistent cache) when next used. Done only on the main thread and never while
    tracing (when a leaf of `args` is a tracer), where clearing could pull a program
    from under a caller.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        return False
    if not programs_crowded(fraction=fraction, limit=limit):
        return False
    jax.clear_caches()
    return True


def programs_crowded(*, fraction: float = 0.75, limit: int | None = None) -> bool:
    """Whether this process has mapped `fraction` of `limit` (default `map_limit()`) memory
    regions: the mark past which `release_programs_if_crowded` clears JAX's caches."""
    regions = mapped_regions()
    return regions is not None and regions >= fraction * (map_limit() if limit is None else limit)
