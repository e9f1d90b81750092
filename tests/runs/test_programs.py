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
from polarize.runs._programs import StoredProgram


def _problem(seed=0):
    model = pz.init_ensemble(seed, 16, tokens=4, dim=3)
    return model, pz.random_direction(seed + 1, 3)


def _loss_and_weights(model, objective):
    # a small batched program of the model and objective (any such function will do)
    return {"weights": jax.nn.softmax(model.a + 1.0, axis=-1), "V": jnp.tanh(model.V) * objective.b[0]}


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _entry(folder: Path) -> tuple[Path, Path]:
    (meta,) = folder.glob("*.json")
    return meta, meta.with_suffix(".bin")


def test_an_entry_is_exported_loaded_and_rebuilt_when_stale_or_corrupt(tmp_path):
    model, objective = _problem()
    expected = _loss_and_weights(model, objective)
    first = StoredProgram(_loss_and_weights, "test", {"k": 1}, tmp_path)
    assert _same(first(model, objective), expected) and first.events == ["exported"]
    other = _problem(seed=5)  # new data of the same shapes: the same program
    assert _same(first(*other), _loss_and_weights(*other)) and first.events == ["exported"]

    def fresh():  # a new process's view: nothing in memory, the entry on disk
        program = StoredProgram(_loss_and_weights, "test", {"k": 1}, tmp_path)
        assert _same(program(model, objective), expected)
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
    StoredProgram(_loss_and_weights, "test", {"k": 2}, tmp_path)(model, objective)
    StoredProgram(_loss_and_weights, "test", {"k": 1}, tmp_path)(*_bigger())
    assert len(list(tmp_path.glob("*.json"))) == 3


def _bigger():
    return pz.init_ensemble(0, 32, tokens=4, dim=3), pz.random_direction(1, 3)


def test_a_program_that_cannot_be_exported_runs_traced_and_is_remembered(tmp_path):
    def checked(model, objective):  # eqx.error_if is a host callback: jax.export refuses it
        out = _loss_and_weights(model, objective)
        return {k: eqx.error_if(v, jnp.any(jnp.isnan(v)), "nan") for k, v in out.items()}

    model, objective = _problem()
    program = StoredProgram(checked, "test", {}, tmp_path)
    assert _same(program(model, objective), _loss_and_weights(model, objective))
    assert program.events == ["not exportable"]
    again = StoredProgram(checked, "test", {}, tmp_path)
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

    config = pz.SweepConfig(tokens=4, dim=3, inits=40, t1=200.0, n_save=16, **settings)
    folder = tmp_path / "programs"
    monkeypatch.setattr(_sweep, "programs_dir", lambda: folder)
    _sweep._stored.cache_clear()
    for name in ("exported", "loaded"):
        pz.run_sweep(config, tmp_path / name)
        solver, decided_clock = _sweep._EXPORTABLE[(config.resolved(), folder)]
        assert type(solver).__name__ == "Tsit5" and decided_clock == clock
        program = _sweep._stored(_sweep._program(config.resolved()), (solver, decided_clock), folder)
        assert program.events == [name]
        _sweep._stored.cache_clear()  # as in a new process
    monkeypatch.setattr(_sweep, "programs_dir", lambda: None)
    pz.run_sweep(config, tmp_path / "traced")
    reference = np.load(tmp_path / "traced" / "per_init.npz")
    for name in ("exported", "loaded"):
        stored = np.load(tmp_path / name / "per_init.npz")
        assert set(stored.files) == set(reference.files)
        for key in reference.files:
            np.testing.assert_array_equal(stored[key], reference[key], err_msg=f"{name}: {key}")
