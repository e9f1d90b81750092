"""The math: normalizations, models, objectives, trajectories and the exact vector fields.

Pure JAX (equinox modules), no solver, optimizer or file. Everything above builds on it.
"""

from . import fields as fields, status as status
from ._errors import PolarizeError as PolarizeError
from ._models import (
    AbstractModel as AbstractModel,
    TiedValueAttention as TiedValueAttention,
    ValueAttention as ValueAttention,
    init_ensemble as init_ensemble,
    init_keys as init_keys,
)
from ._normalizations import (
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
from ._objectives import (
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
from ._times import save_times as save_times
from ._trajectory import Trajectory as Trajectory
from ._weights import distribution as distribution, entropy as entropy
