"""Runs on disk: a sweep's config, its resumable run folder, the runner, results, studies, reports."""

from ._config import SweepConfig as SweepConfig
from ._load import load as load
from ._report import report as report
from ._results import Run as Run
from ._study import StudyResult as StudyResult, load_study as load_study, run_study as run_study
from ._sweep import run_sweep as run_sweep
