"""The math: normalizations, models, objectives, trajectories and the exact vector fields.

Pure JAX (equinox modules), no solver, optimizer or file. Everything above builds on it.
"""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["fields", "status"],
    submod_attrs={
        "_errors": ["PolarizeError"],
        "_models": ["AbstractModel", "TiedValueAttention", "ValueAttention", "init_ensemble", "init_keys"],
        "_normalizations": [
            "NORMALIZATIONS",
            "AbstractNormalization",
            "L1Norm",
            "Linear",
            "Relu",
            "ReluNorm",
            "Sigmoid",
            "SigmoidNorm",
            "Softmax",
            "Softmax1",
            "Sparsemax",
            "SquareNorm",
            "SumNorm",
            "normalization",
        ],
        "_objectives": [
            "AbstractObjective",
            "CrossEntropy",
            "LogisticData",
            "LogisticDirection",
            "Square",
            "conditioned_regression",
            "peaked_distribution",
            "random_direction",
            "random_labels",
        ],
        "_prompt": ["LogisticLabels", "PromptAttention", "SquareLabels", "init_prompts", "prompt_task"],
        "_times": ["save_times"],
        "_trajectory": ["Trajectory"],
        "_weights": ["distribution", "entropy"],
    },
)
