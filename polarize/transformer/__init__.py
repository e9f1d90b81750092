"""Transformer lab: small transformers across attention maps (PAPER.md section 6)."""

from .attention import (
    ATTENTIONS as ATTENTIONS,
    AbstractAttention as AbstractAttention,
    make_attention as make_attention,
)
from .experiments import Config as Config, make_config as make_config, run as run
from .model import Transformer as Transformer
from .tasks import (
    classification as classification,
    induction as induction,
    single_token_attack as single_token_attack,
)
from .train import (
    AbstractTask as AbstractTask,
    Classification as Classification,
    Induction as Induction,
    fit as fit,
)
