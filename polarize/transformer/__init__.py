"""Transformer lab: small transformers across attention normalizations (PAPER.md section 6)."""

from .attention import (
    NORMALIZATIONS as NORMALIZATIONS,
    AbstractNormalization as AbstractNormalization,
    make_normalization as make_normalization,
)
from .experiments import make_config as make_config, run as run
from .model import Transformer as Transformer
from .tasks import (
    classification as classification,
    induction as induction,
    single_token_attack as single_token_attack,
)
from .train import fit as fit
