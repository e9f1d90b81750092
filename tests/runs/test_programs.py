"""Stored sweep programs (`jax.export`): the same numbers as tracing, and a stale or
corrupt entry is detected and rebuilt, never used."""

import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.runs._programs import StoredProgram, stored_value


def _problem(seed=0):
    model = pz.init_ensemble(seed, 16, tokens=4, dim=3)
    return model, pz.random_direction(seed + 1, 3)


def _loss_and_weights(model, objective):
    # a small batched program of the model and objective (any such function will do)
    return {"weights": jax.nn.softmax(model.a + 1.0, axis=-1), "V": jnp.tanh(model.V) * objective.b[0]}


def _made(fn):
    """A `make` that returns `fn`, counting its calls (made only where no entry serves)."""

    def make(model, objective):
        make.calls += 1
        return fn

    make.calls = 0
    return make


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _entry(folder: Path) -> tuple[Path, Path]:
    (meta,) = folder.glob("*.json")
    return meta, meta.with_suffix(".bin")


def test_an_entry_is_exported_loaded_and_rebuilt_when_stale_or_corrupt(tmp_path):
    model, objective = _problem()
    expected = _loss_and_weights(model, objective)
    first = StoredProgram(make := _made(_loss_and_weights), "test", {"k": 1}, tmp_path)
    assert _same(first(model, objective), expected) and first.events == ["exported"]
    assert make.calls == 1
    other = _problem(seed=5)  # new data of the same shapes: the same program
    assert _same(first(*other), _loss_and_weights(*other)) and first.events == ["exported"]

    def fresh():  # a new process's view: nothing in memory, the entry on disk
        program = StoredProgram(make := _made(_loss_and_weights), "test", {"k": 1}, tmp_path)
        assert _same(program(model, objective), expected)
        assert make.calls == (0 if program.events == ["loaded"] else 1)  # loaded: never built
        return program.events

    assert fresh() == ["loaded"]
    meta, blob = _entry(tmp_path)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    blob.write_bytes(bytes(data))
    assert fresh() == ["rebuilt (checksum)"]
    assert fresh() == ["loaded"]  # the rebuilt entry is whole again
    entry = json.loads(meta.read_text())
    entry["material"]["jax"] = "0.0.1"  # an entry of another JAX
    meta.write_text(json.dumps(entry))
    assert fresh() == ["rebuilt (stale)"]
    blob.write_bytes(b"not a program")  # garbage whose checksum is recorded
    entry = json.loads(meta.read_text())
    entry["sha256"] = __import__("hashlib").sha256(b"not a program").hexdigest()
    meta.write_text(json.dumps(entry))
    assert fresh()[0].startswith("rebuilt (does not deserialize")
    meta.write_text("{not json")
    assert fresh() == ["rebuilt (unreadable key)"]
    # other settings or other shapes are other programs, never this one
    assert len(list(tmp_path.glob("*.json"))) == 1
    StoredProgram(_made(_loss_and_weights), "test", {"k": 2}, tmp_path)(model, objective)
    StoredProgram(_made(_loss_and_weights), "test", {"k": 1}, tmp_path)(*_bigger())
    assert len(list(tmp_path.glob("*.json"))) == 3


def _bigger():
    return pz.init_ensemble(0, 32, tokens=4, dim=3), pz.random_direction(1, 3)


def test_a_program_prepared_on_a_stand_in_serves_the_inputs_of_its_shapes(tmp_path):
    # prepared (exported and compiled) on zeros of the inputs' shapes, without running:
    # the call on the real inputs runs that program, and computes what tracing computes
    model, objective = _problem()
    zeros = jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_array(x) else x, (model, objective))
    program = StoredProgram(make := _made(_loss_and_weights), "test", {}, tmp_path)
    program.prepare(*zeros)
    assert program.events == ["exported"] and make.calls == 1 and len(program._compiled) == 1
    assert _same(program(model, objective), _loss_and_weights(model, objective))
    assert program.events == ["exported"] and make.calls == 1 and len(program._compiled) == 1
    program(*_bigger())  # other shapes: another program
    assert len(program._compiled) == 2


def test_a_program_that_cannot_be_exported_runs_traced_and_is_remembered(tmp_path):
    def checked(model, objective):  # eqx.error_if is a host callback: jax.export refuses it
        out = _loss_and_weights(model, objective)
        return {k: eqx.error_if(v, jnp.any(jnp.isnan(v)), "nan") for k, v in out.items()}

    model, objective = _problem()
    program = StoredProgram(_made(checked), "test", {}, tmp_path)
    assert _same(program(model, objective), _loss_and_weights(model, objective))
    assert program.events == ["not exportable"]
    again = StoredProgram(_made(checked), "test", {}, tmp_path)
    assert _same(again(model, objective), _loss_and_weights(model, objective))
    assert again.events == ["not exportable"] and not list(tmp_path.glob("*.bin"))


SQUARE = dict(objective="square", samples=8, kappa=5.0, v_scale=1e-5, a_scale=1e-3)


@pytest.mark.parametrize(
    "settings, clock",
    [
        ({}, "log"),
        # flow's default for square loss reads the objective's curvature (Tsit5 on the
        # linear clock at this horizon): the stored program is traced with that choice,
        # not with the stiff method a traced objective would get
        (SQUARE, "linear"),
    ],
    ids=["logistic", "square"],
)
def test_a_sweep_from_its_stored_program_has_the_numbers_of_a_traced_one(
    tmp_path, monkeypatch, settings, clock
):
    # a first run exports the program, a later one (nothing in memory) loads it; both
    # store exactly what a sweep that traces its program stores
    from polarize.runs import _sweep

    config = pz.SweepConfig(tokens=4, dim=3, inits=40, t1=1e3, n_save=8, **settings)
    folder = tmp_path / "programs"
    monkeypatch.setattr(_sweep, "stored_programs_dir", lambda: folder)
    _sweep._stored.cache_clear()
    for name in ("exported", "loaded"):
        monkeypatch.setattr(_sweep, "_COMPILED", set())  # the first run: compiled on a stand-in
        pz.run_sweep(config, tmp_path / name)
        decision = _sweep._DECIDED[(config.resolved(), folder)]
        assert decision == ["Tsit5", clock]
        program = _sweep._stored(config.resolved().program(), tuple(decision), folder)
        # the stand-in's program is the one the drawn model ran (one program compiled)
        assert program.events == [name] and len(program._compiled) == 1
        _sweep._stored.cache_clear()  # as in a new process
        _sweep._DECIDED.clear()
    monkeypatch.setattr(_sweep, "stored_programs_dir", lambda: None)
    pz.run_sweep(config, tmp_path / "traced")
    reference = np.load(tmp_path / "traced" / "per_init.npz")
    for name in ("exported", "loaded"):
        stored = np.load(tmp_path / name / "per_init.npz")
        assert set(stored.files) == set(reference.files)
        for key in reference.files:
            np.testing.assert_array_equal(stored[key], reference[key], err_msg=f"{name}: {key}")


def test_a_stored_value_is_read_back_and_computed_again_when_stale_or_unreadable(tmp_path, monkeypatch):
    calls = []

    def compute():
        calls.append(1)
        return ["Tsit5", "log"]

    for _ in range(2):  # computed once, then read back
        assert stored_value(tmp_path, "test", {"k": 1}, compute) == ["Tsit5", "log"]
    assert len(calls) == 1
    assert stored_value(tmp_path, "test", {"k": 2}, lambda: None) is None  # other settings: its own entry
    (path,) = [p for p in tmp_path.glob("*.value.json") if json.loads(p.read_text())["value"]]
    entry = json.loads(path.read_text())
    entry["value"], entry["material"]["polarize"] = ["Dopri5", "log"], "an older checkout"
    path.write_text(json.dumps(entry))
    assert stored_value(tmp_path, "test", {"k": 1}, compute) == ["Tsit5", "log"]  # stale: not used
    path.write_text("{not json")
    assert stored_value(tmp_path, "test", {"k": 1}, compute) == ["Tsit5", "log"]
    assert len(calls) == 3
    assert stored_value(tmp_path, "test", {"k": 1}, compute) == ["Tsit5", "log"] and len(calls) == 3


WARM = """
import sys
from polarize.cli import main
code = main(sys.argv[1:])
print("LOADED", *sorted(m for m in ("diffrax", "optax", "optimistix") if m in sys.modules))
sys.exit(code)
"""


def test_a_warm_sweep_runs_its_stored_program_without_loading_the_solvers(tmp_path):
    # what makes a warm `polarize sweep` fast: the stored program and the stored decision
    # of its solver serve, so diffrax (and optimistix with it) is never imported; the numbers
    # are a cold run's. A flow sweep never imports optax, cold or warm.
    import os
    import subprocess
    import sys

    env = {**os.environ, "POLARIZE_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    env.pop("POLARIZE_NO_CACHE", None)
    args = ["sweep", "--tokens", "4", "--dim", "3", "--inits", "40", "--t1", "200", "--no-progress"]

    def run(name):
        cmd = [sys.executable, "-c", WARM, *args, "--out", str(tmp_path / name)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("LOADED")[1].split()

    assert run("cold") == ["diffrax", "optimistix"]
    assert run("warm") == []
    # all of it in the one cache folder (deleting it makes the next run cold), none beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "cold", "warm"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["jax", "programs"]
    assert any((tmp_path / "cache" / "programs").glob("*.bin"))
    cold, warm = (np.load(tmp_path / name / "per_init.npz") for name in ("cold", "warm"))
    assert set(cold.files) == set(warm.files)
    for key in cold.files:
        np.testing.assert_array_equal(warm[key], cold[key], err_msg=key)


def test_a_sweeps_draws_from_stored_programs_are_the_drawn_ones(tmp_path, monkeypatch):
    # where the compile cache is on, the model's normals and the logistic direction come
    # from stored programs (exported, then loaded): the bits of init_ensemble and random_direction
    from polarize.core import _host_draws
    from polarize.runs import _build

    config = pz.SweepConfig(tokens=5, dim=3, seed=7, v_scale=0.3, a_scale=0.2, a_offset=-0.1)
    pieces = [(0, 16), (16, 48), (40, 56)]
    host_max = _host_draws.HOST_MAX_HASHES
    monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", 0)  # jax.random's own draws
    expected = [config.build_model(*p) for p in pieces], config.build_objective()
    monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", host_max)
    monkeypatch.setattr(_build, "stored_programs_dir", lambda: tmp_path)
    # drawn on the host where that is cheaper (a sweep of a few inits): the same bits
    host = [config.build_model(*p) for p in pieces], config.build_objective()
    assert _build._direction_program(3, tmp_path).events == []  # no program ran
    for model, want in zip(host[0], expected[0], strict=True):
        for name in ("V", "a"):
            np.testing.assert_array_equal(getattr(model, name), getattr(want, name))
    np.testing.assert_array_equal(host[1].b, expected[1].b)
    monkeypatch.setattr(_host_draws, "HOST_MAX_HASHES", 0)  # a sweep too large for the host
    for events in (["exported"], ["loaded"]):
        _build._normals_program.cache_clear(), _build._direction_program.cache_clear()  # a new process
        got = [config.build_model(*p) for p in pieces], config.build_objective()
        for model, want in zip(got[0], expected[0], strict=True):
            for name in ("V", "a"):
                np.testing.assert_array_equal(getattr(model, name), getattr(want, name))
        np.testing.assert_array_equal(got[1].b, expected[1].b)
        assert _build._direction_program(3, tmp_path).events == events
        assert {tuple(_build._normals_program(n, 5, 3, "float64", tmp_path).events) for n in (16, 32)} == {
            tuple(events)
        }


def test_a_square_sweeps_data_from_its_stored_program_is_conditioned_regressions(tmp_path, monkeypatch):
    # where the compile cache is on, a square sweep's (X, y) come from one stored program
    # with kappa an argument (exported, then loaded): the bits of `conditioned_regression`
    from polarize.runs import _build

    configs = [
        pz.SweepConfig(objective="square", tokens=4, dim=dim, samples=samples, kappa=kappa, seed=seed)
        for dim, samples, kappa, seed in ((5, 8, 1.0, 0), (5, 8, 3.7, 2), (5, 8, 10.0, 1), (3, None, 2.0, 4))
    ]
    expected = [
        pz.conditioned_regression(_build.stream(c.seed, 2), c.samples or c.dim, c.dim, c.kappa)
        for c in configs
    ]
    monkeypatch.setattr(_build, "stored_programs_dir", lambda: tmp_path)
    for events in (["exported"], ["loaded"]):
        _build._regression_program.cache_clear()  # a new process
        for config, want in zip(configs, expected, strict=True):
            got = config.build_objective()
            assert type(got) is type(want)
            np.testing.assert_array_equal(got.X, want.X)
            np.testing.assert_array_equal(got.y, want.y)
        assert _build._regression_program(8, 5, tmp_path).events == events  # one program for three kappas
        assert _build._regression_program(3, 3, tmp_path).events == events
