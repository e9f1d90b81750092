"""Figures of sweeps and studies, drawn from stored results only (matplotlib, loaded on first use)."""

from ._study import plot_study as plot_study
from ._sweep import sweep_figures as sweep_figures
