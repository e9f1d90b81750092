"""Smoke-run every example with --small, in-process (shared JIT caches), and check what it measured.

Smoke runs of the gradient examples' --small modes: they run, write a figure, and say something true.
"""

import importlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAMES = [
    "logistic_polarization",
    "asymptotics",
    "normalizations",
    "conditioning",
    "flow_vs_gd",
    "cross_entropy",
    "massive_activations",
    "max_margin",
]
FIGURES = {
    "logistic_polarization": ["single.png", "ensemble.png"],
    "asymptotics": ["rate.png"],
    "normalizations": ["normalizations.png"],
    "conditioning": ["conditioning.png"],
    "flow_vs_gd": ["flow_vs_gd.png"],
    "cross_entropy": ["cross_entropy.png"],
    "massive_activations": ["massive_activations.png"],
    "max_margin": ["max_margin.png"],
}


def run(name: str, out: Path) -> dict:
    sys.path.insert(0, str(EXAMPLES))
    try:
        module = importlib.import_module(name)
        numbers = module.main(["--small", "--out", str(out)])
    finally:
        sys.path.remove(str(EXAMPLES))
    for figure in FIGURES[name]:
        assert (out / figure).stat().st_size > 1000
    assert json.loads((out / "numbers.json").read_text())["small"] is True
    return numbers


def _finite(tree, never: bool = False) -> bool:
    """No NaN anywhere; inf only for a time to reach a level (`t_...`, `median_t_...`: never reached)."""
    if isinstance(tree, dict):
        return all(_finite(v, k.startswith(("t_", "median_t_"))) for k, v in tree.items())
    if isinstance(tree, list | tuple):
        return all(_finite(v, never) for v in tree)
    return not isinstance(tree, float) or math.isfinite(tree) or (never and tree == math.inf)


@pytest.mark.parametrize("name", NAMES)
def test_example_small_run(name, tmp_path, capsys):
    numbers = run(name, tmp_path)
    assert "numbers:" in capsys.readouterr().out
    assert _finite(numbers)
    # each smoke run also checks the claim it measures
    if name == "logistic_polarization":
        assert numbers["n_failed"] == 0
        assert numbers["order_preserved_fraction"] == 1.0 and numbers["winner_is_argmax_u0_fraction"] == 1.0
        assert numbers["final_one_hot_fraction"] == 1.0 and numbers["final_median_top_share"] > 0.99
    elif name == "asymptotics":
        assert abs(numbers["median_slope_T8"] + 2) < 0.3 and numbers["n_failed"] == 0
        local = list(numbers["local_slopes_T8"].values())
        assert all(a < b for a, b in zip(local, local[1:], strict=False))  # approaches -2 from below
        assert numbers["gd_steps_per_second"] > 0 and numbers["t_day"] < 1e40
    elif name == "normalizations":
        r = numbers["results"]
        assert r["logistic/softmax"]["median_max_weight"] > 0.8 > r["logistic/sigmoid"]["median_max_weight"]
        assert r["square/softmax"]["median_max_weight"] < 0.5  # square loss: mild
    elif name == "conditioning":
        k = numbers["by_kappa"]
        assert k["kappa=1"]["median_max_weight_t300"] < 0.1 < 0.5 < k["kappa=5"]["median_max_weight_t300"]
    elif name == "flow_vs_gd":
        assert 0.9 < numbers["slope_gd_vs_flow"] < 1.1 and 1.8 < numbers["slope_gd_vs_modified"] < 2.2
        for row in numbers["by_lr"].values():
            assert row["gd_vs_modified"] < 0.1 * row["gd_vs_flow"]
    elif name == "cross_entropy":
        assert numbers["n_failed"] == 0 and numbers["median_cos_beta_logp"] > 0.99
        # polarization itself (uniform is 0.1; measured at --small: median 0.93, one-hot share 0.97)
        assert numbers["median_max_weight"] > 0.85 and numbers["one_hot_fraction"] > 0.8
    elif name == "massive_activations":
        r = numbers["results"]
        assert r["softmax/D=10"]["median_ratio_final"] > 3 > r["sigmoid/D=10"]["median_ratio_final"]
    elif name == "max_margin":
        assert numbers["n_failed"] == 0 and numbers["all_selections_locally_optimal"]
        assert len(numbers["selections"]) > 1 and 0 < numbers["share_best"] < 1  # the inits split
        assert numbers["min_cos_selected_t1"] > 0.999  # p / |p| -> the SVM of its own selection
        assert abs(numbers["median_slope_over_svm_norm"] - 1) < 0.01  # |p| ~ |p_mm| log t
        assert numbers["joint_median_cos_value"] > 0.98


def test_example_rejects_unknown_argument(capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        module = importlib.import_module("asymptotics")
        with pytest.raises(SystemExit) as exc:
            module.main(["--bogus"])
    finally:
        sys.path.remove(str(EXAMPLES))
    assert exc.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


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
