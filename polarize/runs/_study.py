"""Studies: a grid of sweeps described in a TOML file, with a table and a comparison figure.

    name = "conditioning"
    [base]                       # SweepConfig settings shared by every cell
    objective = "square"
    [grid]                       # every combination is one cell (a resumable sweep)
    kappa = [1.0, 3.0, 10.0]
    seed = [0, 1]
    [plot]                       # optional
    x = "kappa"                  # a grid key
    y = ["time_to_0.9", "max_weight"]   # statistics, one panel each

Statistics for `y`: any per-initialization statistic a sweep stores (`max_weight`,
`entropy`, `eff_tokens`, `top_share`, `loss`, `time_to_<level>`, `time_to_loss_<f>`,
`rate_C`, `rate_drift`; for model prompt `max_weight`, `entropy`, `loss`, the hitting
times and the token selection's `share_best`, `cos_selected`, `cos_best`, `p_norm`,
`log_slope`, `svm_norm`, `cos_value`), drawn as the median over finished
initializations with a 10-90% band (log axis for times and rates), or an ensemble
fraction (`one_hot_fraction`, `fraction_reached_<level>`, ...; for model prompt
`share_global_selection`), drawn as a line. The grid key
`seed` counts as replication: cells that differ only in seed are pooled.

The figure (comparison.png): with `x`, the statistics against it, one line per value
of the other grid keys; without `x`, a grid over two keys is a heatmap of each
statistic's median; otherwise the cells' median max weight and one-hot fraction
against time.

A cell that cannot run (an invalid setting) or whose sweep failed for more than half
of its initializations is reported in study.csv (`status`, `error`) and in the
study's summary.json; the other cells go on.
"""

import dataclasses
import json
import os
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import jax
from tqdm import tqdm

from ..core._choices import cpu_threads
from ..core._errors import PolarizeError
from ..figures._study import plot_study as draw_study
from ..solve._devices import barrier, programs_crowded, release_programs_if_crowded
from ._config import SweepConfig
from ._folder import FolderLock, check_study_out, make_folder, resumed_config, stored_config
from ._results import Run, failed_too_many, failure_line, load_run
from ._storage import FigureArrays, read_json, write_json
from ._study_file import Study, load_study
from ._sweep import piece_size, run_sweep


def run_study(
    study: Study | str | os.PathLike,
    out,
    *,
    progress: bool = False,
    cell_figures: bool = False,
) -> dict:
    """Run (or continue) every cell under out/cells/, then write study.csv, summary.json, comparison.png.

    `study` is a `Study` (`load_study`) or the path of a study file. Returns the
    study's summary: {"cells", "failed_cells": {name: reason}}. A failing
    cell does not stop the others. Each cell's own four figures are drawn only with
    `cell_figures` (`polarize report OUT` draws them later from the stored results).
    study.csv and comparison.png are written once every cell's results are on disk.
    """
    if isinstance(study, (str, os.PathLike)):
        study = load_study(study)
    elif not isinstance(study, Study):
        raise PolarizeError(
            f"`study` must be a Study (pz.load_study) or the path of a study file; got {type(study).__name__}"
        )
    out = Path(out)
    spec = out / "study.json"
    if spec.exists() and read_json(spec) != _json_roundtrip(study.to_dict()):
        raise PolarizeError(f"{out} holds a different study; choose another --out")
    check_study_out(out)
    if jax.process_index() == 0:
        make_folder(out)
    barrier("polarize-study-folder")
    with FolderLock(out, jax.process_index(), jax.process_count()):
        if jax.process_index() == 0:
            write_json(spec, study.to_dict())
        barrier("polarize-study-start")
        return _run_cells(study, out, progress=progress, cell_figures=cell_figures)


def _run_cells(study: Study, out: Path, *, progress: bool, cell_figures: bool) -> dict:
    errors, todo = {}, []
    for name, config in study.cells():
        if isinstance(config, PolarizeError):
            errors[name] = f"invalid setting: {config}"
            continue
        cell = out / "cells" / name
        if not ((cell / "summary.json").exists() and stored_config(cell) == resumed_config(config, cell)):
            todo.append((name, config, cell))
    errors |= _run_todo(todo, progress=progress, cell_figures=cell_figures)
    failed = {}
    for name, _ in study.settings():  # in the study's order
        if name in errors:
            failed[name] = errors[name]
        elif failed_too_many(summary := read_json(out / "cells" / name / "summary.json")):
            failed[name] = failure_line(summary)
    result = {"cells": len(study.settings()), "failed_cells": failed}
    if jax.process_index() == 0:
        write_json(out / "summary.json", result)
        finish_study(study, out, failed)
    return result


def _run_cell(name: str, config, cell: Path, *, progress: bool, cell_figures: bool) -> str | None:
    """Run (or resume) one cell's sweep: None, or why it failed."""
    try:
        resume = (cell / "config.json").exists()
        run_sweep(config, cell, resume=resume, progress=progress, figures=cell_figures)
    except PolarizeError as e:
        return str(e)
    finally:
        barrier(f"polarize-study-{name}")
    return None


def side_by_side(configs: list) -> int:
    """How many cells run at once: `cpu_threads()` where each of `configs` is one run of
    blocks (it would leave the other threads idle: see `_sweep.run_chunk`) and this is
    the only process; else 1. Each cell computes what it computes alone, so the numbers
    do not change."""
    threads = cpu_threads()
    if threads == 1 or jax.process_count() > 1 or jax.default_backend() != "cpu":
        return 1
    return threads if all(c.resolved().inits <= piece_size(c) for c in configs) else 1


def _run_todo(todo: list, *, progress: bool, cell_figures: bool) -> dict:
    """{name: why} of the cells of `todo` ([(name, config, folder)]) that failed.

    Cells side by side (`side_by_side`) show one progress bar over cells. The first cell
    runs alone, as it compiles (or loads) the program the others share; then each thread
    takes the next cell as soon as its own is done."""
    at_once = side_by_side([config for _, config, _ in todo])
    if at_once == 1 or len(todo) < 2:
        run = lambda item: _run_cell(*item, progress=progress, cell_figures=cell_figures)
        return {item[0]: why for item in todo if (why := run(item)) is not None}
    bar = tqdm(total=len(todo), unit="cell", desc="study") if progress else None
    run = lambda item: _run_cell(*item, progress=False, cell_figures=cell_figures)
    errors = {}

    def done(item, why):
        if why is not None:
            errors[item[0]] = why
        if bar is not None:
            bar.update(1)

    pool = ThreadPoolExecutor(at_once)
    try:
        done(todo[0], run(todo[0]))  # alone: it compiles the program the others share
        pending, running = list(todo[1:]), {}
        # a cell starts as soon as a thread is free; programs are freed (on this thread)
        # only with no cell running: past the mark, the running cells finish first
        while pending or running:
            while pending and len(running) < at_once:
                item = pending.pop(0)
                running[pool.submit(run, item)] = item
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                done(running.pop(future), future.result())
            if programs_crowded():
                for future in list(running):
                    done(running.pop(future), future.result())
                release_programs_if_crowded()
    finally:  # interrupted: the cells running finish (their chunks are on disk), no new one starts
        pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    return errors


@dataclasses.dataclass(frozen=True)
class CellResults:
    """What the table and the figure read of a finished cell: its `config`, `summary`
    (summary.json) and `arrays` (the `Run.arrays` keys, each read from disk at access)."""

    config: SweepConfig
    summary: dict
    arrays: Mapping


def finished_cells(study: Study, out) -> list[tuple[str, CellResults]]:
    """(name, results) of every cell of `study` in `out` with a summary.json, in the study's order."""
    cells = []
    for name, _ in study.settings():
        folder = Path(out) / "cells" / name
        if (folder / "summary.json").exists():
            cells.append(
                (
                    name,
                    CellResults(
                        stored_config(folder), read_json(folder / "summary.json"), FigureArrays(folder)
                    ),
                )
            )
    return cells


def write_table(study: Study, out, failed: dict):
    """study.csv: one row per cell, its grid values, status, error and every summary number."""
    import pandas as pd

    summaries = {name: cell.summary for name, cell in finished_cells(study, out)}
    rows = []
    for name, setting in study.settings():
        row = {"cell": name, **{k: setting[k] for k in study.grid}}
        row["status"] = "failed" if name in failed else "ok"
        row["error"] = failed.get(name, "")
        if name in summaries:  # the summary's numbers (not its per-chunk notes)
            row.update({k: v for k, v in summaries[name].items() if not isinstance(v, dict | list)})
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(Path(out) / "study.csv", index=False)
    return table


def plot_study(study: Study, out) -> Path:
    """comparison.png across cells, from stored results only."""
    return draw_study(study, finished_cells(study, out), Path(out) / "comparison.png")


def finish_study(study: Study, out, failed: dict) -> list[Path]:
    """study.csv and comparison.png of the study in `out` whose failed cells are `failed`."""
    write_table(study, out, failed)
    return [Path(out) / "study.csv", plot_study(study, out)]


def _json_roundtrip(d: dict) -> dict:
    return json.loads(json.dumps(d))


def _finished_runs(study: Study, out: Path) -> list[tuple[str, Run]]:
    runs = []
    for name, _ in study.settings():
        if (out / "cells" / name / "summary.json").exists():
            runs.append((name, load_run(out / "cells" / name)))
    return runs


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """A study folder: its `study`, `table` (study.csv, one row per cell) and finished `runs`."""

    folder: Path
    study: Study
    table: object
    runs: dict

    def frame(self):
        """Every finished cell's initializations (`Run.frame`), with `cell` and the grid keys first."""
        import pandas as pd

        frames = []
        for name, run in self.runs.items():
            frame = run.frame()
            frame.insert(0, "cell", name)
            frames.append(frame)
        frame = pd.concat(frames, ignore_index=True)
        first = ["cell", *self.study.grid]
        return frame[first + [c for c in frame.columns if c not in first]]


def load_result(out) -> StudyResult:
    """A study folder, read without recomputing anything."""
    import pandas as pd

    out = Path(out)
    spec = read_json(out / "study.json")
    study = Study.from_dict(spec)
    if not (out / "study.csv").exists():
        raise PolarizeError(f"`dir` {out} holds an unfinished study (no study.csv); rerun it first")
    return StudyResult(out, study, pd.read_csv(out / "study.csv"), dict(_finished_runs(study, out)))
