"""Transformer lab: small transformers across attention normalizations (PAPER.md section 6)."""

from .attention import NORMALIZATIONS as NORMALIZATIONS
from .attention import AbstractNormalization as AbstractNormalization
from .attention import make_normalization as make_normalization
from .experiments import make_config as make_config
from .experiments import run as run
from .model import Transformer as Transformer
from .tasks import classification as classification
from .tasks import induction as induction
from .tasks import single_token_attack as single_token_attack
from .train import fit as fit
