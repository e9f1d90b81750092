"""A study's table (study.csv) and comparison figure (comparison.png), from its cells'
stored results only.

Plain Python, numpy, pandas and matplotlib, no JAX: the `polarize study` command has
them written by its figure process (`_drawing.FigureProcess.finish_study`), which
loaded pandas and matplotlib on another core while the cells ran, so that the process
that solves loads neither; `polarize report` and `run_study` without a figure process
write them here, with the same functions on the same stored files.
"""

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from ..figures._study import plot_study as draw_study
from ._config import SweepConfig
from ._folder import stored_config
from ._storage import FigureArrays, read_json
from ._study_file import Study


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
