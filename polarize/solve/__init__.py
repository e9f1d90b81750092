"""Solving the dynamics: the exact flow (diffrax), discrete optimizers (optax), hitting times.

One batched integration engine runs every explicit solve in fixed blocks of
initializations; a Rosenbrock-W method takes the stiff long horizons; hitting times
are located on the solver's own steps.
"""

from ._descent import descend as descend, descend_with_hitting_times as descend_with_hitting_times
from ._flow import flow as flow, modified_flow as modified_flow
from ._hitting import (
    descent_hitting_times as descent_hitting_times,
    flow_with_hitting_times as flow_with_hitting_times,
    hitting_times as hitting_times,
)
from ._options import SolveOptions as SolveOptions
