"""`polarize.load(DIR)`: a finished sweep folder or study folder, read back."""

from pathlib import Path

from ._results import Run, load_run
from ._study import StudyResult, load_result


def load(out) -> Run | StudyResult:
    """A finished sweep folder as a `Run`, or a study folder as a `StudyResult`."""
    if (Path(out) / "study.json").exists():
        return load_result(out)
    return load_run(out)
