"""Runs on disk: a sweep's config, its resumable run folder, the runner, results, studies, reports."""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=[],
    submod_attrs={
        "_config": ["SweepConfig"],
        "_load": ["load"],
        "_report": ["report"],
        "_results": ["Run"],
        "_study": ["StudyResult", "run_study"],
        "_study_file": ["load_study"],
        "_sweep": ["run_sweep"],
    },
)
