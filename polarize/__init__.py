"""polarize: a JAX laboratory for the training dynamics of softmax attention."""

from . import dynamics as dynamics
from .descent import descend as descend
from .errors import PolarizeError as PolarizeError
from .flow import flow as flow
from .flow import save_times as save_times
from .grads import ADJOINTS as ADJOINTS
from .grads import adjoint as adjoint
from .grads import final_entropy as final_entropy
from .grads import final_loss as final_loss
from .grads import final_max_weight as final_max_weight
from .models import (
    AbstractModel as AbstractModel,
)
from .models import (
    TiedValueAttention as TiedValueAttention,
)
from .models import (
    ValueAttention as ValueAttention,
)
from .models import (
    init_ensemble as init_ensemble,
)
from .models import (
    init_keys as init_keys,
)
from .modified import modified_flow as modified_flow
from .normalizations import (
    NORMALIZATIONS as NORMALIZATIONS,
)
from .normalizations import (
    AbstractNormalization as AbstractNormalization,
)
from .normalizations import (
    L1Norm as L1Norm,
)
from .normalizations import (
    Linear as Linear,
)
from .normalizations import (
    Relu as Relu,
)
from .normalizations import (
    ReluNorm as ReluNorm,
)
from .normalizations import (
    Sigmoid as Sigmoid,
)
from .normalizations import (
    SigmoidNorm as SigmoidNorm,
)
from .normalizations import (
    Softmax as Softmax,
)
from .normalizations import (
    Softmax1 as Softmax1,
)
from .normalizations import (
    Sparsemax as Sparsemax,
)
from .normalizations import (
    SquareNorm as SquareNorm,
)
from .normalizations import (
    SumNorm as SumNorm,
)
from .normalizations import (
    normalization as normalization,
)
from .objectives import (
    AbstractObjective as AbstractObjective,
)
from .objectives import (
    CrossEntropy as CrossEntropy,
)
from .objectives import (
    LogisticData as LogisticData,
)
from .objectives import (
    LogisticDirection as LogisticDirection,
)
from .objectives import (
    Square as Square,
)
from .objectives import (
    conditioned_regression as conditioned_regression,
)
from .objectives import (
    peaked_distribution as peaked_distribution,
)
from .objectives import (
    random_direction as random_direction,
)
from .objectives import (
    random_labels as random_labels,
)
from .statistics import Summary as Summary
from .statistics import summarize as summarize
from .sweep import SweepConfig as SweepConfig
from .sweep import load as load
from .sweep import run_sweep as run_sweep
from .trajectory import Trajectory as Trajectory
