"""Named model configurations, in one place.

``small`` ... ``10B`` follow the standard size table (vocabulary 10 000, batch 4, context 512);
``leaderboard-8b`` is the 8B leaderboard model; ``tiny`` runs on a CPU in seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from .model import AttentionFn, BasicsTransformerLM


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    batch_size: int = 4

    def model_kwargs(self) -> dict:
        """Keyword arguments of :class:`BasicsTransformerLM`."""
        kwargs = asdict(self)
        del kwargs["batch_size"]
        return kwargs

    def with_(self, **changes) -> ModelConfig:
        """A copy with some fields overridden, e.g. ``cfg.with_(context_length=2048)``."""
        unknown = set(changes) - set(asdict(self))
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return replace(self, **changes)

    @property
    def parameter_count(self) -> int:
        """Exact number of parameters of the model this config builds."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        per_block = 4 * d * d + 3 * d * f + 2 * d
        return v * d + self.num_layers * per_block + d + d * v


def _size(d_model: int, d_ff: int, num_layers: int, num_heads: int) -> ModelConfig:
    return ModelConfig(10_000, 512, d_model, num_layers, num_heads, d_ff)


STANDARD_SIZES = ("small", "medium", "large", "xl", "10B")
"""The presets of the standard size table, smallest first."""

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=503, context_length=128, d_model=64, num_layers=2, num_heads=4, d_ff=176),
    "small": _size(768, 3072, 12, 12),
    "medium": _size(1024, 4096, 24, 16),
    "large": _size(1280, 5120, 36, 20),
    "xl": _size(2560, 10240, 32, 32),
    "10B": _size(4608, 12288, 50, 36),
    "leaderboard-8b": ModelConfig(
        vocab_size=151_936, context_length=32_768, d_model=4096, num_layers=34, num_heads=32, d_ff=11_008,
        batch_size=2,
    ),
}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def build_model(
    config: ModelConfig | str,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    attention_fn: AttentionFn | None = None,
) -> BasicsTransformerLM:
    """Instantiate :class:`BasicsTransformerLM` for a config or preset name."""
    if isinstance(config, str):
        config = get_preset(config)
    return BasicsTransformerLM(**config.model_kwargs(), attention_fn=attention_fn, device=device, dtype=dtype)
