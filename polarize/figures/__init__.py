"""Figures of sweeps and studies, drawn from stored results only (matplotlib, loaded on first use)."""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=[],
    submod_attrs={
        "_study": ["plot_study"],
        "_sweep": ["sweep_figures"],
    },
)
