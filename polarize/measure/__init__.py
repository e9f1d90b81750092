"""What is measured of trajectories: polarization statistics, rates, differentiable statistics,
sinks, and the token selection of prompt attention with its max-margin SVMs."""

import lazy_loader

# Each name is imported from its module on first use (`import polarize` loads no JAX).
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["sinks"],
    submod_attrs={
        "_grads": ["ADJOINTS", "adjoint", "final_entropy", "final_loss", "final_max_weight"],
        "_rates": ["logistic_rate"],
        "_selection": ["TokenSelection", "token_selection"],
        "_svm": ["MaxMargin", "attention_svm", "best_tokens", "value_svm"],
        "_statistics": ["Summary", "aggregate", "quantile", "summarize"],
    },
)
