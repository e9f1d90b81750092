import atexit
import gc
import os
import subprocess
import sys

# XLA's older loop emitter for every CPU program the suite compiles (and, through the
# environment, its subprocesses): the suite's time is mostly XLA compiling (about 600 s of
# CPU of 930 s of test time), and this emitter compiles a flow program about 30% faster
# and runs it 8-40% slower, which programs solved once at a test's size never feel. Every
# assertion is the same; the numbers differ from XLA's default emitter in rounding only (of
# benchmarks/same_numbers.py's five sweeps, four identical, the stiff square one's final
# statistics by up to 4e-14 relative and its hitting times by 1.5e-11; NOTES.md). The
# product keeps XLA's defaults. And LLVM's -O2 pipeline instead of XLA's default -O3: about
# 15% less CPU over the suite on the AMD machine (benchmarks/NOTES.md), the code still
# vectorized (rows of a block still round by their place in it). And no loop unrolling
# (XLA's `xla_cpu_disable_loop_unrolling`): about 11% less CPU again on the AMD machine;
# reductions sum in another order, so numbers move in the last bits (the five sweeps'
# statistics by up to 6.5e-12 relative, the same steps and statuses). To run the suite
# with XLA's defaults: POLARIZE_TEST_XLA_DEFAULTS=1 python -m pytest
EMITTER = (
    "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=2"
    " --xla_backend_extra_options=xla_cpu_disable_loop_unrolling"
)


def _ask_xla(flags: str) -> subprocess.Popen:
    """A subprocess whose exit status says whether this jaxlib's XLA starts with `flags` in
    XLA_FLAGS: it ends the process on a flag it does not know (pyproject allows jaxlibs
    from 0.4.35, which may predate this option, and a later one may drop it), so the suite
    asks once, and the xdist workers inherit the answer (checked: one subprocess for
    `-n 2`). It runs while this process imports JAX (XLA reads XLA_FLAGS when its backend
    starts, not on import): the run's start was 1.6 s later with the question asked first
    (benchmarks/NOTES.md)."""
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    code = "import jax; jax.numpy.zeros(1).block_until_ready()"
    out = subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out, stderr=out)


_flags = os.environ.get("XLA_FLAGS", "")
# each flag only where XLA_FLAGS does not set it already; none with POLARIZE_TEST_XLA_DEFAULTS=1
_ours = " ".join(f for f in EMITTER.split() if f.split("=")[0] not in _flags)
if os.environ.get("POLARIZE_TEST_XLA_DEFAULTS") == "1":
    _ours = ""
_asked = _ask_xla(f"{_flags} {_ours}".strip()) if _ours else None

import jax  # noqa: E402

# Python's full collections (of the oldest generation) after 100 collections of the middle
# one instead of 10, as the `polarize` command does (`cli.FULL_COLLECTION_EVERY`): a
# worker's heap grows to millions of objects, JAX's caches of the programs it traced and
# compiled, and each full collection scanned all of it for little garbage, 3.5% of the
# test time of tests/solve and tests/core (1.6% now; benchmarks/NOTES.md). Young garbage
# is collected as before.
_young, _middle, _ = gc.get_threshold()
gc.set_threshold(_young, _middle, 100)

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

# Tests never write the CLI's persistent compilation cache into the user's home.
os.environ.setdefault("POLARIZE_NO_CACHE", "1")
# pytest-xdist already keeps every core busy with one worker each: flows and sweeps run
# their chunks in one thread here (tests/solve/test_fastpaths.py checks the threaded path
# against this one bit for bit).
os.environ.setdefault("POLARIZE_THREADS", "1")

import pytest  # noqa: E402

try:  # pytest's key for the number of its end-of-session collections (see pytest_configure)
    from _pytest.unraisableexception import gc_collect_iterations_key as _UNRAISABLE_GC  # noqa: E402
except ImportError:
    _UNRAISABLE_GC = None

from polarize.solve._devices import release_programs_if_crowded  # noqa: E402

# the answer before any JAX backend starts here or in a worker (none has: only imports ran)
if _asked is not None and _asked.wait() == 0:
    os.environ["XLA_FLAGS"] = f"{_flags} {_ours}".strip()


@pytest.fixture(autouse=True, scope="module")
def _programs_released_when_crowded():
    # one worker compiles thousands of programs; JAX keeps them all, and near the kernel's
    # limit of memory maps XLA's next compile segfaults (flows and descents check this
    # themselves; this covers the tests that run neither)
    yield
    release_programs_if_crowded()


class _Compiles:
    """XLA compiles by program name while `counting` (JAX's listeners cannot be removed)."""

    def __init__(self):
        self.names, self.on = [], False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kw):
        if self.on and event == "/jax/core/compile/backend_compile_duration":
            self.names.append(kw.get("fun_name"))

    def counting(self, fn, *args, **kwargs):
        """(fn's result, the names of the programs compiled while it ran)."""
        self.names, self.on = [], True
        try:
            return jax.block_until_ready(fn(*args, **kwargs)), list(self.names)
        finally:
            self.on = False


_COMPILES = []


@pytest.fixture
def compiles():
    """`compiles.counting(fn, *args)`: fn's result and the programs XLA compiled for it."""
    if not _COMPILES:
        _COMPILES.append(_Compiles())
    return _COMPILES[0]


def _end_worker():
    """Ends an xdist worker once its results are with the controller, without Python
    tearing down JAX's runtime object by object: the whole run's end (from the last test
    to the controller's) took 10.7 s with it, 5.4 s without, the other core idle
    meanwhile (benchmarks/NOTES.md). The same shortcut as `polarize.cli.run`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_configure(config):
    # pytest (9.2) runs a full collection twice at a session's end, to report unraisable
    # exceptions of objects freed then: about 1.5 s each over a worker's heap of JAX's
    # programs, while the controller waits; a worker then ends by `os._exit`, which frees
    # nothing anyway. Exceptions raised while a test runs are reported as before.
    if os.environ.get("PYTEST_XDIST_WORKER") and _UNRAISABLE_GC is not None:
        config.stash[_UNRAISABLE_GC] = 0


def pytest_unconfigure(config):
    # registered last, so run first of the exit handlers: JAX's own would free the same
    # programs; a worker's outcome has reached the controller by now (xdist sends it at
    # the session's end), and without xdist the process ends as usual, with its exit code
    if os.environ.get("PYTEST_XDIST_WORKER"):
        atexit.register(_end_worker)


def pytest_report_header(config):
    return f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')!r} (tests/conftest.py)"
