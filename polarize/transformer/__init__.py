"""Transformer lab: small transformers across attention maps (Varre, Rofin &
Flammarion, arXiv:2603.06248, section 6).

The names below are imported from their modules on first use, as in every package of
polarize: the lab pulls in matplotlib and its training code, which the other commands
of the CLI do not need.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "attention": ["ATTENTIONS", "AbstractAttention", "make_attention"],
        "experiments": ["Config", "make_config", "run"],
        "model": ["Transformer"],
        "tasks": ["classification", "induction", "single_token_attack"],
        "train": ["AbstractTask", "Classification", "Induction", "fit"],
    },
)
