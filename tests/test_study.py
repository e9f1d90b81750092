"""A small study end to end, and `report` redrawing its figures from stored results."""

from pathlib import Path

import numpy as np

from polarize.cli import main

STUDY = """
name = "tiny"
[base]
tokens = 4
dim = 3
t1 = 1e3
n_save = 8
inits = 64
[grid]
norm = ["softmax", "sigmoid"]
a_scale = [0.0, 0.5]
"""


def test_study_runs_resumes_and_reports(tmp_path, capsys):
    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    out = tmp_path / "study"
    assert main(["study", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert "4 cells" in capsys.readouterr().out
    lines = (out / "study.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert header[:3] == ["cell", "norm", "a_scale"] and len(lines) == 5
    rows = {line.split(",")[0]: dict(zip(header, line.split(","), strict=True)) for line in lines[1:]}
    softmax = float(rows["norm=softmax__a_scale=0.0"]["median_max_weight"])
    sigmoid = float(rows["norm=sigmoid__a_scale=0.0"]["median_max_weight"])
    assert softmax > 0.5 > sigmoid  # the comparison the study exists for
    figures = sorted(out.rglob("*.png"))
    assert out / "comparison.png" in figures and len(figures) == 1 + 4 * 4
    before = {p: p.read_bytes() for p in figures}
    for p in figures:
        p.unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")}
    assert main(["report", str(out)]) == 0
    assert sorted(out.rglob("*.png")) == figures
    assert all(p.read_bytes() == before[p] for p in figures)  # same figures, from stored data
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")} == mtimes  # nothing recomputed
    # rerunning a finished study recomputes nothing either
    assert main(["study", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")} == mtimes


def test_bad_study_files(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[grid]\nnorm = ["softmax"]\ntokenz = [3]\n')
    assert main(["study", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "unknown setting(s) ['tokenz'] in [grid]" in capsys.readouterr().err
    bad.write_text('[grid]\nnorm = ["softmaxx"]\n')
    assert main(["study", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "`norm` must be one of" in capsys.readouterr().err
    assert main(["study", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a sweep folder" in capsys.readouterr().err


def test_shipped_study_files_are_valid():
    from polarize.study import load_study

    root = Path(__file__).parents[1] / "examples"
    for name in ("normalizations.toml", "conditioning.toml"):
        study = load_study(root / name)
        assert len(study.cells()) >= 5
    assert np.isclose(load_study(root / "conditioning.toml").cells()[0][1].t1, 300.0)
