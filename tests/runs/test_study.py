"""A small study end to end, and `report` redrawing its figures from stored results."""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import polarize as pz
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
    assert header[:5] == ["cell", "norm", "a_scale", "status", "error"] and len(lines) == 5
    rows = {line.split(",")[0]: dict(zip(header, line.split(","), strict=True)) for line in lines[1:]}
    softmax = float(rows["norm=softmax__a_scale=0.0"]["median_max_weight"])
    sigmoid = float(rows["norm=sigmoid__a_scale=0.0"]["median_max_weight"])
    assert softmax > 0.5 > sigmoid  # the comparison the study exists for
    # the comparison only: each cell's own four figures are drawn on request (`report`)
    assert sorted(out.rglob("*.png")) == [out / "comparison.png"]
    before = (out / "comparison.png").read_bytes()
    (out / "comparison.png").unlink()
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")}
    assert main(["report", str(out)]) == 0
    figures = sorted(out.rglob("*.png"))
    assert out / "comparison.png" in figures and len(figures) == 1 + 4 * 4
    assert (out / "comparison.png").read_bytes() == before  # the same figure, from stored data
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")} == mtimes  # nothing recomputed
    # rerunning a finished study recomputes nothing either
    assert main(["study", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.npz")} == mtimes


def test_bad_study_files(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[grid]\nnorm = ["softmax"]\ntokenz = [3]\n')
    assert main(["study", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "unknown setting(s) ['tokenz'] in [grid]" in capsys.readouterr().err
    bad.write_text('[grid]\nnorm = ["softmax"]\n[plot]\ny = "speed"\n')
    assert main(["study", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[plot] y = 'speed' is not a statistic; valid: max_weight, entropy" in err
    assert "time_to_0.9" in err
    assert main(["study", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a sweep folder" in capsys.readouterr().err


FAILING = """
name = "failing"
[base]
tokens = 3
dim = 3
n_save = 8
inits = 8
[grid]
kappa = [0.5, 1.0]
t1 = [1e2, 1e6]
[plot]
x = "kappa"
y = ["time_to_0.5", "max_weight"]
"""


def test_a_failing_cell_is_reported_and_the_others_go_on(tmp_path, capsys):
    """An invalid setting and a cell where every init fails; the rest runs, exit 1 at the end."""
    spec = tmp_path / "failing.toml"
    # Tsit5 on the log clock reaches t = 100 in 30 steps but not 1e6 (the stiff default would need more).
    grid = FAILING.replace("[grid]", '[grid]\nobjective = ["cross-entropy"]\nmax_steps = [30]')
    spec.write_text(grid.replace("[base]", '[base]\nsolver = "tsit5"'))
    out = tmp_path / "study"
    assert main(["study", str(spec), "--out", str(out), "--no-progress"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("3 of 4 cells failed: ")
    assert "kappa=0.5__t1=100.0: invalid setting: `kappa` must be >= 1; got 0.5" in lines[-1]
    assert "max_steps_reached" in lines[-1] and "kappa=1.0__t1=100.0" not in lines[-1]
    table = pd.read_csv(out / "study.csv")
    assert list(table["status"]) == ["failed", "failed", "ok", "failed"]
    assert table.loc[2, "n_failed"] * 2 <= 8 and table.loc[3, "n_failed"] == 8  # at most half: ok
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["failed_cells"]) == sorted(table["cell"][table["status"] == "failed"])
    # two statistics against kappa, and the survival curve of the hitting time
    assert plt.imread(out / "comparison.png").shape[1] == 3 * 6 * 120


def test_cells_side_by_side_compute_what_each_computes_alone(tmp_path, monkeypatch, capsys):
    """On two threads, cells that are one run of blocks each go two at a time (the first
    alone); every cell stores the numbers it stores alone, and failures are reported as
    they are one at a time."""
    from polarize.runs import _study

    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    monkeypatch.setenv("POLARIZE_THREADS", "1")
    assert main(["study", str(spec), "--out", str(tmp_path / "alone"), "--no-progress"]) == 0
    monkeypatch.setenv("POLARIZE_THREADS", "2")
    at_once = []
    side_by_side = _study.side_by_side
    monkeypatch.setattr(
        _study, "side_by_side", lambda configs: at_once.append(side_by_side(configs)) or at_once[-1]
    )
    assert main(["study", str(spec), "--out", str(tmp_path / "side"), "--no-progress"]) == 0
    assert at_once == [2]
    cells = sorted(p.name for p in (tmp_path / "alone" / "cells").iterdir())
    assert len(cells) == 4 and cells == sorted(p.name for p in (tmp_path / "side" / "cells").iterdir())
    for cell in cells:
        alone = np.load(tmp_path / "alone" / "cells" / cell / "per_init.npz")
        side = np.load(tmp_path / "side" / "cells" / cell / "per_init.npz")
        assert sorted(alone.files) == sorted(side.files)
        for key in alone.files:
            np.testing.assert_array_equal(side[key], alone[key], err_msg=f"{cell}: {key}")
    capsys.readouterr()
    failing = tmp_path / "failing.toml"
    grid = FAILING.replace("[grid]", '[grid]\nobjective = ["cross-entropy"]\nmax_steps = [30]')
    failing.write_text(grid.replace("[base]", '[base]\nsolver = "tsit5"'))
    assert main(["study", str(failing), "--out", str(tmp_path / "failing"), "--no-progress"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("3 of 4 cells failed: ")
    table = pd.read_csv(tmp_path / "failing" / "study.csv")
    assert list(table["status"]) == ["failed", "failed", "ok", "failed"]
    # a cell of more than one run of blocks already keeps both threads busy: one at a time
    big = pz.SweepConfig(inits=5000)
    assert side_by_side([pz.SweepConfig(inits=200), big]) == 1 and side_by_side([pz.SweepConfig()]) == 2


def test_cells_side_by_side_free_programs_only_with_no_cell_running(tmp_path, monkeypatch, capsys):
    """Each thread takes the next cell when its own is done; past the memory-map mark the
    running cells finish before JAX's caches are cleared, and every cell runs once."""
    import threading

    from polarize.runs import _study

    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    monkeypatch.setenv("POLARIZE_THREADS", "2")
    lock, running, ran, released = threading.Lock(), [0], [], []
    run_cell = _study._run_cell

    def counted(name, *args, **kwargs):
        with lock:
            running[0] += 1
            ran.append(name)
        try:
            return run_cell(name, *args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(_study, "_run_cell", counted)
    monkeypatch.setattr(_study, "programs_crowded", lambda: True)
    monkeypatch.setattr(_study, "release_programs_if_crowded", lambda: released.append(running[0]))
    assert main(["study", str(spec), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert sorted(ran) == sorted(p.name for p in (tmp_path / "s" / "cells").iterdir()) and len(ran) == 4
    assert released and set(released) == {0}


def test_the_first_cell_runs_alone_then_the_others_side_by_side(tmp_path, monkeypatch, capsys):
    """The first cell compiles the program the others share: it ends before any other
    starts; the others then run two at a time, and a failing first cell stops no one."""
    import threading

    from polarize.core._errors import PolarizeError
    from polarize.runs import _study

    spec = tmp_path / "tiny.toml"
    spec.write_text(STUDY)
    monkeypatch.setenv("POLARIZE_THREADS", "2")
    events, lock, both = [], threading.Lock(), threading.Barrier(2, timeout=20)
    run_cell = _study._run_cell

    def logged(name, *args, **kwargs):
        with lock:
            events.append(("start", name))
            meets = sum(what == "start" for what, _ in events) in (2, 3)
        if meets:  # the two cells after the first meet here: they run side by side
            both.wait()
        try:
            return run_cell(name, *args, **kwargs)
        finally:
            with lock:
                events.append(("end", name))

    monkeypatch.setattr(_study, "_run_cell", logged)
    assert main(["study", str(spec), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    first = events[0][1]
    assert events[:2] == [("start", first), ("end", first)]
    assert [what for what, _ in events[2:4]] == ["start", "start"]  # met at the barrier
    assert sorted(name for what, name in events if what == "end") == sorted(
        p.name for p in (tmp_path / "s" / "cells").iterdir()
    )
    # a first cell refused at once: the others run all the same
    monkeypatch.setattr(_study, "_run_cell", run_cell)
    run_sweep = _study.run_sweep

    def refuse_first(config, cell, **kwargs):
        if cell.name == "norm=softmax__a_scale=0.0":
            raise PolarizeError("refused")
        return run_sweep(config, cell, **kwargs)

    monkeypatch.setattr(_study, "run_sweep", refuse_first)
    capsys.readouterr()
    assert main(["study", str(spec), "--out", str(tmp_path / "r"), "--no-progress"]) == 1
    assert "1 of 4 cells failed: norm=softmax__a_scale=0.0: refused" in capsys.readouterr().out


def test_the_survival_legend_rounds_to_0_or_100_percent_only_when_exact():
    from polarize.figures._study import percent

    shares = (0.0, 0.001, 0.005, 0.01, 0.45, 0.99, 0.995, 0.9999, 1.0)
    assert [percent(x) for x in shares] == ["0%", "<1%", "<1%", "1%", "45%", "99%", ">99%", ">99%", "100%"]


def test_the_survival_curve_is_the_fraction_reached_by_t():
    from polarize.figures._study import hitting_statistics, reached_by

    times = np.array([1.0, 5.0, np.inf, 2.0, 5.0])  # inf: never reached by t1
    ts = np.array([0.5, 1.0, 3.0, 5.0, 1e300])
    expected = [sum(x <= t for x in times) / len(times) for t in ts]  # a Python loop
    assert reached_by(times, ts).tolist() == expected == [0.0, 0.2, 0.4, 0.8, 0.8]
    assert hitting_statistics(["max_weight", "time_to_0.9", "median_time_to_loss_0.001"]) == [
        "time_to_0.9",
        "median_time_to_loss_0.001",
    ]


HEAT = """
name = "heat"
[base]
objective = "square"
tokens = 3
dim = 3
t1 = 100.0
n_save = 8
inits = 16
[grid]
kappa = [1.0, 4.0]
v_scale = [0.1, 0.5]
seed = [0, 1]
[plot]
y = ["time_to_0.5", "one_hot_fraction"]
"""


def test_two_key_grid_heatmap_and_study_tables(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "heat.toml"
    spec.write_text(HEAT)
    out = tmp_path / "heat"
    assert main(["study", str(spec), "--out", str(out), "--no-progress"]) == 0
    result = pz.load(out)
    frame = result.frame()
    assert len(frame) == 8 * 16 and list(frame.columns[:4]) == ["cell", "kappa", "v_scale", "seed"]
    assert set(frame["cell"]) == set(result.table["cell"])
    # the table's medians are the frame's medians, cell by cell
    for cell, rows in frame.groupby("cell"):
        row = result.table[result.table["cell"] == cell].iloc[0]
        assert row["median_max_weight"] == rows["final_max_weight"][rows["ok"]].median()
    # the heatmap pools seeds: its numbers are the pooled medians
    from polarize.figures._study import _point

    runs = [r for r in result.runs.values() if r.config.kappa == 4.0 and r.config.v_scale == 0.5]
    pooled = frame[(frame["kappa"] == 4.0) & (frame["v_scale"] == 0.5) & frame["ok"]]["time_to_0.5"]
    assert len(runs) == 2 and _point(runs, "time_to_0.5")[0] == pz.measure.quantile(pooled, 0.5)
    image = plt.imread(out / "comparison.png")
    assert image.shape[1] > 1000  # two panels
    # the cells share one compiled program (they differ only in data): each cell's numbers
    # are still its own, those of the API on that cell's model and data
    cell, run = next((c, r) for c, r in result.runs.items() if r.config.seed == 1 and r.config.kappa == 4.0)
    model, obj = run.config.build_model(0, 128), run.config.build_objective()  # the sweep's piece
    traj, times = pz.flow_with_hitting_times(model, obj, t1=100.0, n_save=8)
    rows = frame[frame["cell"] == cell]
    np.testing.assert_array_equal(pz.summarize(traj, obj).final["max_weight"][:16], rows["final_max_weight"])
    np.testing.assert_array_equal(times["time_to_0.5"][:16], rows["time_to_0.5"])


def test_shipped_study_files_are_valid():
    from polarize.runs._study_file import load_study

    root = Path(__file__).parents[2] / "examples"
    for name in ("normalizations.toml", "conditioning.toml"):
        study = load_study(root / name)
        assert len(study.cells()) >= 5
    conditioning = load_study(root / "conditioning.toml")
    assert np.isclose(conditioning.cells()[0][1].t1, 300.0)
    assert conditioning.x == "kappa" and conditioning.y == ("time_to_0.9", "max_weight")
