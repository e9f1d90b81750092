"""Smoke-run every benchmark script in --quick mode (it must finish and print its table).

Each compiles several solvers (tens of seconds on 2 cores), so these are `slow`.
"""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


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
