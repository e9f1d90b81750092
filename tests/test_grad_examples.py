"""Smoke runs of the gradient examples' --small modes: they run, write a figure, and say something true."""

import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sensitivity_small(tmp_path):
    numbers = load("sensitivity").main(["--small", "--out", str(tmp_path)])
    assert (tmp_path / "sensitivity.png").stat().st_size > 0
    assert (tmp_path / "sensitivity.json").exists()
    assert numbers["n_failed"] == 0 and len(numbers["winners"]) > 1
    assert numbers["ratio_grad_a"] > 1 and numbers["ratio_grad_V"] > 1  # boundaries are more sensitive


@pytest.mark.slow  # four gradient programs to compile: ~50 s on a quiet 2-core machine
def test_delay_polarization_small(tmp_path):
    numbers = load("delay_polarization").main(["--small", "--out", str(tmp_path)])
    assert (tmp_path / "delay_polarization.png").stat().st_size > 0
    init = numbers["initialization"]
    assert init["n_failed"] == 0
    assert np.all(np.array(init["entropy_end"]) > np.array(init["entropy_start"]))  # optax raised H(t*)
    for design in (numbers["sink"], numbers["temperature"]):
        assert design["root"] is not None and design["ok"]
        assert abs(design["value_at_root"] - numbers["target"]) < 1e-6
