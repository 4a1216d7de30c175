"""The reference Transformer LM and its training pieces."""

from .checkpoint import load_checkpoint, save_checkpoint
from .data import get_batch
from .model import (
    BasicsTransformerLM,
    CausalMultiHeadSelfAttention,
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    TransformerBlock,
    naive_attention,
)
from .nn_utils import clip_gradients, cross_entropy, softmax
from .optimizer import AdamW, get_lr_cosine_schedule
from .presets import PRESETS, ModelConfig, build_model, get_preset

__all__ = [
    "PRESETS",
    "AdamW",
    "BasicsTransformerLM",
    "CausalMultiHeadSelfAttention",
    "Embedding",
    "Linear",
    "ModelConfig",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "build_model",
    "clip_gradients",
    "cross_entropy",
    "get_batch",
    "get_lr_cosine_schedule",
    "get_preset",
    "load_checkpoint",
    "naive_attention",
    "save_checkpoint",
    "softmax",
]
