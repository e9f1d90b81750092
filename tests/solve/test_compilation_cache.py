"""`pz.enable_compilation_cache`: a later process loads what an earlier one compiled, with
the same numbers, and a bad folder is one clear error. The cache is process-wide (JAX's
own setting), so everything that turns it on runs in a subprocess."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import jax
import pytest

import polarize as pz
from polarize.solve._devices import cpu_kind, host_cpu

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

# a small toy flow, then its arrays' digest and JAX's cache events as one JSON line
FLOW = """
import hashlib, json, sys
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
events = {}
jax.monitoring.register_event_listener(lambda name, **_: events.update({name: events.get(name, 0) + 1}))
import polarize as pz
folder = pz.enable_compilation_cache(sys.argv[1]) if sys.argv[1] != "-" else None
traj = pz.flow(pz.init_ensemble(0, 16, tokens=4, dim=4), pz.random_direction(1, 4), t1=100.0)
arrays = (traj.ts, traj.V, traj.a, traj.weights, traj.loss, traj.ok, traj.status, traj.steps)
digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in arrays)).hexdigest()
counts = {k.rsplit("/", 1)[1]: v for k, v in events.items() if k.startswith("/jax/compilation_cache/")}
print(json.dumps({"folder": folder and str(folder), "digest": digest, **counts}))
"""


def run(code: str, *args: str, env: dict = ENV) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_later_process_loads_every_program_and_gets_the_same_numbers(tmp_path):
    folder = tmp_path / "cache"
    first = run(FLOW, str(folder))
    second = run(FLOW, str(folder))
    uncached = run(FLOW, "-")
    assert first["folder"] == str(folder) and (folder / "jax").is_dir()
    # the first process compiled and stored every program, the small ones too; the second
    # compiled none of them
    assert first["cache_misses"] >= 3 and "cache_hits" not in first
    assert second["cache_hits"] == first["cache_misses"] and "cache_misses" not in second
    assert len(list((folder / "jax").rglob("*-cache"))) == first["cache_misses"]
    assert "cache_hits" not in uncached and "cache_misses" not in uncached
    assert first["digest"] == second["digest"] == uncached["digest"]


def test_another_kind_of_cpu_compiles_its_own_programs(tmp_path):
    # a program compiled for this CPU's instruction set would still load on a CPU without
    # it (XLA only logs that it may end in SIGILL): machines that share the folder, a home
    # on a cluster, each keep their own
    folder = tmp_path / "cache"
    here = run(FLOW, str(folder))
    other = "import polarize.solve._devices as d; d.host_cpu = lambda: 'x86_64-another'\n"
    there = run(other + FLOW, str(folder))
    assert "cache_hits" not in there and there["cache_misses"] == here["cache_misses"]
    kinds = sorted(p.name for p in (folder / "jax").iterdir())
    assert kinds == sorted([host_cpu(), "x86_64-another"]) and host_cpu() != "x86_64-another"
    assert there["digest"] == here["digest"]


def test_host_cpu_names_this_machines_kind():
    # the same name on every call, and one that says the architecture
    name = host_cpu()
    assert name == host_cpu.__wrapped__() and name.startswith(f"{platform.machine()}-") and len(name) > 13
    # what tells two kinds apart is the CPU's model and instruction set, not its clock: two
    # readings of one machine differ in `cpu MHz`; a Zen 3 and a Zen 5 virtual machine
    # both say "AMD EPYC" and differ in family, model and AVX-512
    zen5 = CPUINFO.format(family=26, model=2, mhz="2595.124", flags="avx2 avx512f")
    assert cpu_kind(zen5) == cpu_kind(CPUINFO.format(family=26, model=2, mhz="3100.5", flags="avx2 avx512f"))
    assert cpu_kind(zen5) != cpu_kind(CPUINFO.format(family=25, model=1, mhz="2595.124", flags="avx2"))
    assert cpu_kind(zen5) != cpu_kind(CPUINFO.format(family=26, model=2, mhz="2595.124", flags="avx2"))
    # only the first processor's lines count (a second one's clock differs too)
    assert cpu_kind(zen5) == cpu_kind(zen5 + "\n" + CPUINFO.format(family=26, model=2, mhz="1.0", flags="x"))


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
cpu MHz\t\t: {mhz}
flags\t\t: fpu sse2 {flags}
"""


def test_a_second_folder_moves_the_cache(tmp_path):
    # JAX opens its persistent cache once per process; a call with another folder reopens
    # it there, and what compiles next is stored in the new folder only
    code = (
        "import sys, jax, jax.numpy as jnp, polarize as pz\n"
        "pz.enable_compilation_cache(sys.argv[1])\n"
        "jnp.sin(jnp.arange(3.0)).block_until_ready()\n"
        "pz.enable_compilation_cache(sys.argv[2])\n"
        "jnp.cos(jnp.arange(5.0)).block_until_ready()\n"
        "print('{}')\n"
    )
    run(code, str(tmp_path / "a"), str(tmp_path / "b"))
    names = {d: sorted(p.name.split("-")[0] for p in (tmp_path / d / "jax").rglob("*-cache")) for d in "ab"}
    assert "jit_sin" in names["a"] and "jit_cos" not in names["a"]
    assert "jit_cos" in names["b"] and "jit_sin" not in names["b"]


def test_the_default_folder_is_the_clis_and_polarize_no_cache_turns_it_off(tmp_path):
    code = "import json, polarize as pz\nprint(json.dumps({'folder': str(pz.enable_compilation_cache())}))\n"
    env = {**ENV, "POLARIZE_CACHE_DIR": str(tmp_path / "cli"), "POLARIZE_NO_CACHE": ""}
    assert run(code, env=env)["folder"] == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "jax").is_dir()
    # the suite runs with POLARIZE_NO_CACHE=1 (conftest.py): nothing is turned on
    before = jax.config.jax_compilation_cache_dir
    assert os.environ["POLARIZE_NO_CACHE"] and pz.enable_compilation_cache() is None
    assert jax.config.jax_compilation_cache_dir == before


def test_a_bad_path_is_one_error_naming_it(tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    before = jax.config.jax_compilation_cache_dir
    message = r"^`path` must be a folder that can be created: .*a-file"
    with pytest.raises(pz.PolarizeError, match=message) as e:
        pz.enable_compilation_cache(taken)
    assert "\n" not in str(e.value)
    assert jax.config.jax_compilation_cache_dir == before
    with pytest.raises(
        pz.PolarizeError, match=r"^`path` must be a folder's path \(a str or a path\) or None; got 3$"
    ):
        pz.enable_compilation_cache(3)
    assert jax.config.jax_compilation_cache_dir == before
