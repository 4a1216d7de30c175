"""The model shapes the analysis questions ask about, for reports that may not import the model package.

They mirror ``cs336_basics.presets`` (a test checks that they agree); ``batch`` is the default batch in
sequences and ``context_length`` the default sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    batch: int = 4


def _standard(d_model: int, d_ff: int, num_layers: int, num_heads: int) -> ModelShape:
    return ModelShape(10_000, 512, d_model, num_layers, num_heads, d_ff)


MODEL_SHAPES: dict[str, ModelShape] = {
    "small": _standard(768, 3072, 12, 12),
    "medium": _standard(1024, 4096, 24, 16),
    "large": _standard(1280, 5120, 36, 20),
    "xl": _standard(2560, 10240, 32, 32),
    "10B": _standard(4608, 12288, 50, 36),
    "leaderboard-8b": ModelShape(151_936, 32_768, 4096, 34, 32, 11_008, batch=2),
}
