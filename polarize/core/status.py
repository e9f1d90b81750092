"""Per-initialization status codes shared by `flow`, `modified_flow`, `descend` and sweeps.

One convention everywhere: `Trajectory.status` holds one of the integer codes below
for every initialization, `ok` is `status == OK`. A failed initialization keeps its
code and never stops the rest of the batch.
"""

import numpy as np

#: Finished, every saved value finite.
OK = 0
#: The solver hit `max_steps` before t1.
MAX_STEPS = 1
#: The solver's step size collapsed or its implicit solve failed (stiffness, blow-up).
SOLVER_FAILED = 2
#: The run finished but produced NaN or Inf (descent that diverged, overflow).
NONFINITE = 3
#: The integration itself diverged (event / singular state reported by the solver).
DIVERGED = 4

#: Code -> name, as written in summaries and printed by the CLI.
NAMES = {
    OK: "ok",
    MAX_STEPS: "max_steps_reached",
    SOLVER_FAILED: "solver_failed",
    NONFINITE: "nonfinite",
    DIVERGED: "diverged",
}

#: A hint for each failure, printed after the counts.
HINTS = {
    MAX_STEPS: "raise --max-steps, or use a stiff solver for long horizons",
    SOLVER_FAILED: "tighten or loosen --rtol/--atol, or try another --solver",
    NONFINITE: "lower the learning rate or the horizon; check the objective's scale",
    DIVERGED: "lower the learning rate or the horizon",
}


def name(code: int) -> str:
    """The name of a status code ("unknown(<code>)" for a code outside `NAMES`)."""
    return NAMES.get(int(code), f"unknown({int(code)})")


def counts(status) -> dict[str, int]:
    """Failed initializations per status name (OK excluded), in code order."""
    codes, n = np.unique(np.asarray(status), return_counts=True)
    return {name(c): int(k) for c, k in zip(codes, n) if c != OK}
