"""Transformer lab: small transformers across attention normalizations (PAPER.md section 6)."""

from .attention import (
    NORMALIZATIONS as NORMALIZATIONS,
)
from .attention import (
    AbstractNormalization as AbstractNormalization,
)
from .attention import (
    make_normalization as make_normalization,
)
from .model import Transformer as Transformer
