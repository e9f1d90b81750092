"""A sweep's figures, and a study's table and figure, written by the figure process are
those written here, and when that process cannot write them they are written here, never
lost."""

import shutil

import pytest

import polarize as pz
from polarize.runs import SweepConfig, load_study, run_study, run_sweep
from polarize.runs._drawing import FigureProcess, draw_here

NAMES = {"weights.png", "entropy_hist.png", "winners.png", "one_hot_fraction.png"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished sweep folder without figures, and its config (the shapes and options of
    tests/runs/test_folders.py's sweeps: a worker that ran those has its program)."""
    out = tmp_path_factory.mktemp("drawing") / "run"
    config = SweepConfig(tokens=4, dim=3, n_save=8, inits=8, t1=1e3).resolved()
    run_sweep(config, out, figures=False)
    assert not list(out.glob("*.png"))
    return config, out


def copy_of(folder, to):
    shutil.copytree(folder, to)
    return to


@pytest.mark.parametrize("threads", ["1", "2"])  # on two, a fork of it draws every other figure
def test_the_figure_process_draws_the_figures_drawn_here(finished, tmp_path, monkeypatch, threads):
    monkeypatch.setenv("POLARIZE_THREADS", threads)
    config, out = finished
    there = copy_of(out, tmp_path / "there")
    here = copy_of(out, tmp_path / "here")
    paths = FigureProcess().draw(config, there)
    assert {p.name for p in paths} == NAMES and all(p.parent == there for p in paths)
    draw_here(config, here)
    for name in NAMES:  # the same functions on the same stored arrays: the same bytes
        assert (there / name).read_bytes() == (here / name).read_bytes(), name


def test_a_figure_process_that_died_leaves_the_drawing_to_this_one(finished, tmp_path):
    config, out = finished
    folder = copy_of(out, tmp_path / "run")
    figures = FigureProcess()
    figures._proc.kill()
    figures._proc.wait()
    paths = figures.draw(config, folder)
    assert {p.name for p in paths} == NAMES and all(p.stat().st_size > 10_000 for p in paths)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_folder_whose_figures_cannot_be_drawn_is_an_error_not_a_silence(
    finished, tmp_path, monkeypatch, threads
):
    monkeypatch.setenv("POLARIZE_THREADS", threads)
    config, out = finished
    folder = copy_of(out, tmp_path / "run")
    (folder / "series.npz").unlink()
    with pytest.raises(FileNotFoundError, match="series.npz"):
        FigureProcess().draw(config, folder)


def test_a_figure_process_never_asked_ends_when_closed():
    figures = FigureProcess()
    proc = figures._proc
    figures.close()
    assert proc.poll() == 0
    figures.close()  # twice is fine


STUDY = """name = "drawn"
[base]
objective = "square"
tokens = 3
dim = 3
inits = 8
t1 = 100.0
n_save = 8
[grid]
kappa = [1.0, 3.0]
seed = [0, 1]
[plot]
x = "kappa"
y = ["time_to_0.5", "max_weight"]
"""


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A finished study folder (table and figure written here), its study and failed cells."""
    folder = tmp_path_factory.mktemp("study")
    (folder / "drawn.toml").write_text(STUDY)
    study = load_study(folder / "drawn.toml")
    result = run_study(folder / "drawn.toml", folder / "study")  # a path is read as load_study reads it
    return study, folder / "study", result["failed_cells"]


def test_run_study_takes_a_study_or_its_file_and_names_anything_else(tmp_path):
    with pytest.raises(pz.PolarizeError, match="`study` must be a Study .* path of a study file; got dict"):
        run_study({"grid": {"kappa": [1.0]}}, tmp_path / "o")
    with pytest.raises(pz.PolarizeError, match="does not exist"):
        run_study(tmp_path / "missing.toml", tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_the_figure_process_writes_the_study_table_and_figure_written_here(finished_study, tmp_path):
    study, out, failed = finished_study
    there = copy_of(out, tmp_path / "there")
    for name in ("study.csv", "comparison.png"):
        (there / name).unlink()
    paths = FigureProcess(study=True).finish_study(study, there, failed)
    assert paths == [there / "study.csv", there / "comparison.png"]
    for name in ("study.csv", "comparison.png"):  # the same functions on the same stored files
        assert (there / name).read_bytes() == (out / name).read_bytes(), name


def test_a_figure_process_that_died_leaves_the_study_table_and_figure_to_this_one(finished_study, tmp_path):
    study, out, failed = finished_study
    folder = copy_of(out, tmp_path / "study")
    for name in ("study.csv", "comparison.png"):
        (folder / name).unlink()
    figures = FigureProcess(study=True)
    figures._proc.kill()
    figures._proc.wait()
    assert figures.finish_study(study, folder, failed) == [folder / "study.csv", folder / "comparison.png"]
    for name in ("study.csv", "comparison.png"):
        assert (folder / name).read_bytes() == (out / name).read_bytes(), name
