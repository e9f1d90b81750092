"""Smoke-run every benchmark script in --quick mode (it must finish and print its table).

Each compiles several solvers (tens of seconds on 2 cores), so these are `slow`.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the scripts that measure and record (same_numbers.py compares two trees' stored numbers,
#: gpu_bits.py a GPU's compiles: checks with no quick mode and no table, run by hand)
CHECKS = {"same_numbers.py", "gpu_bits.py"}
SCRIPTS = sorted(
    p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_") and p.name not in CHECKS
)


def test_every_benchmark_is_listed():
    assert {"flow_ensemble.py", "descent_ensemble.py", "scaling.py"} <= set(SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_quick_mode_runs(script):
    before = (
        (ROOT / "benchmarks" / "RESULTS.md").read_text()
        if (ROOT / "benchmarks" / "RESULTS.md").exists()
        else None
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| --- |" in out.stdout.replace("|---|", "| --- |")  # printed a table
    after = (
        (ROOT / "benchmarks" / "RESULTS.md").read_text()
        if (ROOT / "benchmarks" / "RESULTS.md").exists()
        else None
    )
    assert after == before  # --quick never overwrites measured results


def test_recording_a_section_keeps_the_others(tmp_path, monkeypatch):
    """Rewriting one section of RESULTS.md leaves every other section and its markers intact."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import _common

    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(_common, "RESULTS", results)
    for section in ("a", "adjoints", "b"):
        _common.record(section, f"Title {section}", f"body {section} v1", quick=False)
    _common.record("adjoints", "Adjoints", "body adjoints v2", quick=False)
    text = results.read_text()
    for section in ("a", "adjoints", "b"):
        assert text.count(f"<!-- begin {section} -->") == 1 and text.count(f"<!-- end {section} -->") == 1
    assert "body a v1" in text and "body b v1" in text and "body adjoints v2" in text
    assert "body adjoints v1" not in text
    assert (
        text.index("<!-- begin a -->")
        < text.index("<!-- begin adjoints -->")
        < text.index("<!-- begin b -->")
    )


def test_hand_written_floor_solves_the_same_flow():
    """objectives.py's floor (the toy by hand-written Tsit5 on (u, a), no diffrax) takes
    flow's steps and lands where flow does: it times the same solve, not an easier one."""
    sys.path.insert(0, str(ROOT))
    import polarize as pz
    from benchmarks import objectives

    model = pz.init_ensemble(0, 256, tokens=8, dim=8, v_scale=0.1)
    objective = pz.random_direction(1, 8)
    _, steps, iterations, a = objectives.handwritten_floor(model, objective, 1e5)
    traj = pz.flow(model, objective, t1=1e5, n_save=2, rtol=objectives.RTOL, atol=objectives.ATOL)
    assert np.max(np.abs(np.asarray(traj.a[:, -1]) - a)) < 1e-9
    # polarized (one logit ahead by far), so a loop that did not integrate would fail above
    assert np.min(np.max(a, axis=1) - np.median(a, axis=1)) > 1.0
    assert steps == float(np.mean(np.asarray(traj.steps))) and iterations >= steps


@pytest.mark.parametrize("script", ["latency.py"])
def test_a_bad_repeats_is_one_line_not_a_traceback(script):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--repeats", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "--repeats must be a positive number of runs; got 0" in out.stderr.splitlines()[-1]
