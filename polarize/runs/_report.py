"""`polarize report DIR`: redraw every figure of a sweep or study folder from stored results."""

from pathlib import Path

from ..figures._sweep import sweep_figures
from ._folder import folder_kind
from ._load import load
from ._study import load_result, plot_study


def report(folder) -> list[Path]:
    """Regenerate the figures of a finished sweep or study; returns their paths. Nothing is recomputed."""
    folder = Path(folder)
    if folder_kind(folder) == "study":
        study = load_result(folder).study
        paths = []
        for name, _ in study.settings():
            if (folder / "cells" / name / "summary.json").exists():
                paths += report(folder / "cells" / name)
        return paths + [plot_study(study, folder)]
    run = load(folder)
    return sweep_figures(run.arrays, run.config, folder)
