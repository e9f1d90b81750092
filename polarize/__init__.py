"""polarize: a JAX laboratory for the training dynamics of softmax attention."""

from . import fields as fields, sinks as sinks, status as status, transformer as transformer
from .config import SweepConfig as SweepConfig
from .descent import descend as descend
from .errors import PolarizeError as PolarizeError
from .flow import flow as flow, modified_flow as modified_flow
from .grads import (
    ADJOINTS as ADJOINTS,
    adjoint as adjoint,
    final_entropy as final_entropy,
    final_loss as final_loss,
    final_max_weight as final_max_weight,
)
from .hitting import (
    descent_hitting_times as descent_hitting_times,
    flow_with_hitting_times as flow_with_hitting_times,
    hitting_times as hitting_times,
    logistic_rate as logistic_rate,
)
from .models import (
    AbstractModel as AbstractModel,
    TiedValueAttention as TiedValueAttention,
    ValueAttention as ValueAttention,
    init_ensemble as init_ensemble,
    init_keys as init_keys,
)
from .normalizations import (
    NORMALIZATIONS as NORMALIZATIONS,
    AbstractNormalization as AbstractNormalization,
    L1Norm as L1Norm,
    Linear as Linear,
    Relu as Relu,
    ReluNorm as ReluNorm,
    Sigmoid as Sigmoid,
    SigmoidNorm as SigmoidNorm,
    Softmax as Softmax,
    Softmax1 as Softmax1,
    Sparsemax as Sparsemax,
    SquareNorm as SquareNorm,
    SumNorm as SumNorm,
    normalization as normalization,
)
from .objectives import (
    AbstractObjective as AbstractObjective,
    CrossEntropy as CrossEntropy,
    LogisticData as LogisticData,
    LogisticDirection as LogisticDirection,
    Square as Square,
    conditioned_regression as conditioned_regression,
    peaked_distribution as peaked_distribution,
    random_direction as random_direction,
    random_labels as random_labels,
)
from .results import Run as Run, load as load
from .statistics import Summary as Summary, summarize as summarize
from .study import load_study as load_study, run_study as run_study
from .sweep import run_sweep as run_sweep
from .times import save_times as save_times
from .trajectory import Trajectory as Trajectory
