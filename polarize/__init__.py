"""polarize: a JAX laboratory for the training dynamics of softmax attention.

Layers, each importing only those below it (checked by import-linter, pyproject.toml):
`cli` > `transformer` > `runs` > `figures` > `measure` > `solve` > `core`.
"""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["transformer"],
    submod_attrs={
        "core": [
            "NORMALIZATIONS",
            "AbstractModel",
            "AbstractNormalization",
            "AbstractObjective",
            "CrossEntropy",
            "L1Norm",
            "Linear",
            "LogisticData",
            "LogisticDirection",
            "PolarizeError",
            "Relu",
            "ReluNorm",
            "Sigmoid",
            "SigmoidNorm",
            "Softmax",
            "Softmax1",
            "Sparsemax",
            "Square",
            "SquareNorm",
            "SumNorm",
            "TiedValueAttention",
            "Trajectory",
            "ValueAttention",
            "conditioned_regression",
            "fields",
            "init_ensemble",
            "init_keys",
            "normalization",
            "peaked_distribution",
            "random_direction",
            "random_labels",
            "save_times",
            "status",
        ],
        "measure": [
            "ADJOINTS",
            "Summary",
            "adjoint",
            "final_entropy",
            "final_loss",
            "final_max_weight",
            "logistic_rate",
            "sinks",
            "summarize",
        ],
        "runs": ["Run", "SweepConfig", "load", "load_study", "run_study", "run_sweep"],
        "solve": [
            "SolveOptions",
            "descend",
            "descend_with_hitting_times",
            "descent_hitting_times",
            "flow",
            "flow_with_hitting_times",
            "hitting_times",
            "modified_flow",
        ],
    },
)
