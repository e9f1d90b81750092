"""polarize: a JAX laboratory for the training dynamics of softmax attention.

Layers, each importing only those below it (checked by import-linter, pyproject.toml):
`cli` > `transformer` > `runs` > `figures` > `measure` > `solve` > `core`.
"""

from . import transformer as transformer
from .core import (
    NORMALIZATIONS as NORMALIZATIONS,
    AbstractModel as AbstractModel,
    AbstractNormalization as AbstractNormalization,
    AbstractObjective as AbstractObjective,
    CrossEntropy as CrossEntropy,
    L1Norm as L1Norm,
    Linear as Linear,
    LogisticData as LogisticData,
    LogisticDirection as LogisticDirection,
    PolarizeError as PolarizeError,
    Relu as Relu,
    ReluNorm as ReluNorm,
    Sigmoid as Sigmoid,
    SigmoidNorm as SigmoidNorm,
    Softmax as Softmax,
    Softmax1 as Softmax1,
    Sparsemax as Sparsemax,
    Square as Square,
    SquareNorm as SquareNorm,
    SumNorm as SumNorm,
    TiedValueAttention as TiedValueAttention,
    Trajectory as Trajectory,
    ValueAttention as ValueAttention,
    conditioned_regression as conditioned_regression,
    fields as fields,
    init_ensemble as init_ensemble,
    init_keys as init_keys,
    normalization as normalization,
    peaked_distribution as peaked_distribution,
    random_direction as random_direction,
    random_labels as random_labels,
    save_times as save_times,
    status as status,
)
from .measure import (
    ADJOINTS as ADJOINTS,
    Summary as Summary,
    adjoint as adjoint,
    final_entropy as final_entropy,
    final_loss as final_loss,
    final_max_weight as final_max_weight,
    logistic_rate as logistic_rate,
    sinks as sinks,
    summarize as summarize,
)
from .runs import (
    Run as Run,
    SweepConfig as SweepConfig,
    load as load,
    load_study as load_study,
    run_study as run_study,
    run_sweep as run_sweep,
)
from .solve import (
    SolveOptions as SolveOptions,
    descend as descend,
    descend_with_hitting_times as descend_with_hitting_times,
    descent_hitting_times as descent_hitting_times,
    flow as flow,
    flow_with_hitting_times as flow_with_hitting_times,
    hitting_times as hitting_times,
    modified_flow as modified_flow,
)
