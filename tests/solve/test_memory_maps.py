"""A process that compiles many programs frees them before it runs out of memory maps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polarize.solve._devices import mapped_regions

ROOT = Path(__file__).parents[2]

# in a fresh process: clearing JAX's caches here would make the rest of this worker recompile
SCRIPT = """
import threading
import jax
jax.config.update("jax_enable_x64", True)
import polarize as pz
from polarize.solve import _devices
from polarize.solve._devices import mapped_regions, release_programs_if_crowded

# under a trace, off the main thread and below the mark: nothing is released
traced = []
jax.jit(lambda x: traced.append(release_programs_if_crowded(x, limit=1)) or x)(1.0)
threaded = []
worker = threading.Thread(target=lambda: threaded.append(release_programs_if_crowded(limit=1)))
worker.start(); worker.join()
assert traced == [False] and threaded == [False], (traced, threaded)
assert not release_programs_if_crowded()

square = jax.jit(lambda x: x * x)
square(2.0)
assert square._cache_size() == 1
assert release_programs_if_crowded(limit=1) and square._cache_size() == 0

# flows and descents release on entry: past the mark (a limit of 1 region here), a
# program compiled before them is gone after them
_devices.map_limit = lambda: 1
model = pz.init_ensemble(0, 8, tokens=4, dim=4)
objective = pz.random_direction(1, 4)
for run in (lambda: pz.flow(model, objective, t1=1e3), lambda: pz.descend(model, objective, 0.1, steps=10)):
    square(2.0)
    assert square._cache_size() == 1
    run()
    assert square._cache_size() == 0, run
print("ok")
"""


@pytest.mark.skipif(mapped_regions() is None, reason="memory maps are counted on Linux only")
def test_programs_are_released_near_the_map_limit():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]
