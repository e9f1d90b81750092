"""Solving the dynamics: the exact flow (diffrax), discrete optimizers (optax), hitting times.

One batched integration engine runs every explicit solve in fixed blocks of
initializations; a Rosenbrock-W method takes the stiff long horizons; hitting times
are located on the solver's own steps.
"""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=[],
    submod_attrs={
        "_descent": ["descend", "descend_with_hitting_times", "descent_hitting_times"],
        "_devices": ["enable_compilation_cache"],
        "_flow": ["flow", "modified_flow"],
        "_hitting": ["flow_with_hitting_times", "hitting_times"],
        "_options": ["SolveOptions"],
    },
)
