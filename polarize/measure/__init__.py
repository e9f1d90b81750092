"""What is measured of trajectories: polarization statistics, rates, differentiable statistics, sinks."""

from . import sinks as sinks
from ._grads import (
    ADJOINTS as ADJOINTS,
    adjoint as adjoint,
    final_entropy as final_entropy,
    final_loss as final_loss,
    final_max_weight as final_max_weight,
)
from ._rates import logistic_rate as logistic_rate
from ._statistics import (
    Summary as Summary,
    aggregate as aggregate,
    quantile as quantile,
    summarize as summarize,
)
