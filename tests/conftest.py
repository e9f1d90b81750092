import gc
import os

import jax

# The suite compiles with XLA's defaults, the code users get: the bit-identity tests
# check the compiled code that ships. (For a quicker local run, XLA_FLAGS may ask for
# cheaper compiles, e.g. "--xla_backend_optimization_level=2"; the numbers may then move
# in their last bits: docs/performance.md, "The test suite".)

# Python's full collections (of the oldest generation) after 100 collections of the middle
# one instead of 10, as the `polarize` command does (`cli.FULL_COLLECTION_EVERY`): a
# worker's heap grows to millions of objects, JAX's caches of the programs it traced and
# compiled, and each full collection scans all of it for little garbage.
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

from polarize.solve._devices import release_programs_if_crowded  # noqa: E402


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
