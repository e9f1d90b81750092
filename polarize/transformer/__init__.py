"""Transformer lab: small transformers across attention maps (PAPER.md section 6).

The names below are imported from their modules on first use: the lab pulls in
matplotlib and its training code, which `import polarize` and the other commands of
the CLI do not need (~0.4 s of every process's start).
"""

import importlib

#: public name -> the module of this package that defines it
_EXPORTS = {
    "ATTENTIONS": "attention",
    "AbstractAttention": "attention",
    "make_attention": "attention",
    "Config": "experiments",
    "make_config": "experiments",
    "run": "experiments",
    "Transformer": "model",
    "classification": "tasks",
    "induction": "tasks",
    "single_token_attack": "tasks",
    "AbstractTask": "train",
    "Classification": "train",
    "Induction": "train",
    "fit": "train",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
