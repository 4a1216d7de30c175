"""The attention implementations the benchmark times, by name, each with the layout it takes natively.

- ``ours``: :func:`flashattn.flash_attention`, the public path (on H100 / H200 the sm90 Gluon kernels where
  they cover the call, else the portable Triton kernels);
- ``portable``: the portable Triton kernels for both passes; ``gluon``: the sm90 Gluon forward with the
  portable backward; ``gluon_bwd``: the sm90 Gluon forward and backward (what ``ours`` runs on sm90). Where
  a named set cannot take a call, the set the public path plans runs instead;
- ``fa4``, ``fa4_det``: FlashAttention-4 (``flash_attn.cute.flash_attn_func`` on ``(B, S, H, d)``), with
  its default and its deterministic backward; only where ``flash_attn.cute`` imports (never a dependency);
- ``naive``: plain PyTorch attention (the score matrix in memory);
- ``sdpa_flash``, ``sdpa_cudnn``: ``F.scaled_dot_product_attention`` pinned to one backend.
"""

from typing import NamedTuple

import torch
from flashattn import flash_attention
from flashattn.plain import naive_attention
from torch.nn.attention import SDPBackend

from flashattn_bench.util import AttentionFn, kernel_sets, sdpa

FA4_DTYPES = (torch.bfloat16, torch.float16)


class Implementation(NamedTuple):
    """``attend(q, k, v, is_causal) -> o`` on tensors of ``layout`` (``"bhsd"``: ``(B, H, S, d)``;
    ``"bshd"``: ``(B, S, H, d)``); ``grouped``: takes K/V with fewer heads than Q (others get them expanded,
    untimed); ``dtypes``: what it takes (None: any); ``external``: a third-party kernel whose errors mark
    its cell instead of stopping the run."""

    attend: AttentionFn
    layout: str = "bhsd"
    grouped: bool = False
    dtypes: tuple[torch.dtype, ...] | None = None
    external: bool = False


def fa4(deterministic: bool = False) -> AttentionFn:
    """FlashAttention-4's ``flash_attn_func`` as ``(q, k, v, is_causal) -> o`` on ``(B, S, H, d)`` tensors;
    raises ``ImportError`` (or what the import raises) when ``flash_attn.cute`` does not import."""
    from flash_attn.cute import flash_attn_func

    def attend(q, k, v, is_causal):
        out = flash_attn_func(q, k, v, causal=is_causal, deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out  # some releases return (out, lse)

    return attend


def fa4_missing() -> str | None:
    """None when FlashAttention-4 imports, else one line saying why it is skipped."""
    try:
        fa4()
    except Exception as exc:  # any failure of an optional third-party import means: skip it
        return f"fa4, fa4_det skipped: flash_attn.cute does not import ({type(exc).__name__}: {exc})"[:200]
    return None


def available(names: list[str]) -> list[str]:
    """``names`` without FlashAttention-4's where ``flash_attn.cute`` does not import (said in one line)."""
    external = [n for n in names if n.startswith("fa4")]
    if external and (missing := fa4_missing()) is not None:
        print(missing, flush=True)
        return [n for n in names if n not in external]
    return names


FACTORIES = {
    "ours": lambda: Implementation(flash_attention, grouped=True),
    "portable": lambda: Implementation(kernel_sets("portable", "portable"), grouped=True),
    "gluon": lambda: Implementation(kernel_sets("sm90", "portable"), grouped=True),
    "gluon_bwd": lambda: Implementation(kernel_sets("sm90", "sm90"), grouped=True),
    "fa4": lambda: Implementation(fa4(False), "bshd", True, FA4_DTYPES, True),
    "fa4_det": lambda: Implementation(fa4(True), "bshd", True, FA4_DTYPES, True),
    "naive": lambda: Implementation(naive_attention),
    "sdpa_flash": lambda: Implementation(sdpa(SDPBackend.FLASH_ATTENTION)),
    "sdpa_cudnn": lambda: Implementation(sdpa(SDPBackend.CUDNN_ATTENTION)),
}


def implementations(names: list[str]) -> dict[str, Implementation]:
    """The implementations of ``names`` (FlashAttention-4's only when it imports: see :func:`fa4_missing`)."""
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        raise ValueError(f"unknown implementations {unknown}; known: {list(FACTORIES)}")
    return {name: FACTORIES[name]() for name in names}
