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
import sys, threading
LIMIT = int(sys.argv[1])
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

# a flow and a descent at each new shape, ~700 regions: with a limit 500 above the start,
# they keep the process below it themselves
start = mapped_regions()
_devices.map_limit = lambda: start + LIMIT
peak = start
for T in range(4, 7):
    model = pz.init_ensemble(0, 8, tokens=T, dim=T)
    objective = pz.random_direction(1, T)
    pz.flow(model, objective, t1=1e3)
    peak = max(peak, mapped_regions())
    pz.descend(model, objective, 0.1, steps=10)
    peak = max(peak, mapped_regions())
print(start, peak)
"""


@pytest.mark.skipif(mapped_regions() is None, reason="memory maps are counted on Linux only")
def test_flows_at_many_shapes_stay_below_the_map_limit():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, "500"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    start, peak = map(int, out.stdout.split())
    # without release (a limit of 1e9) the three shapes add ~2200 regions, one ~700
    assert peak < start + 500 + 900, (start, peak)
