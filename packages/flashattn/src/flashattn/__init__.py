"""FlashAttention-2 for PyTorch: Triton kernels for every NVIDIA GPU from sm_80, warp-specialised Gluon
kernels on sm90 (H100, H200), a tiled PyTorch version for every other device, and a plain reference.

Public names (imported on first use, so ``import flashattn`` and every command's ``--help`` stay light):

- :func:`flash_attention` ``(q, k, v, is_causal=False, window=None, *, softmax_scale=None, return_lse=False)``
  on ``(..., H, seq, d)``; :func:`flash_attention_varlen` ``(q, k, v, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, is_causal=False, window=None, ...)`` on packed ``(total, H, d)`` documents.
  Both are ``torch.library`` custom ops with fake implementations and registered autograd:
  ``torch.compile(fullgraph=True)``, ``torch.export`` and CUDA graphs trace them; autocast casts as for SDPA;
  gradients of gradients are refused with an error;
- :func:`choose` says which kernels a call runs and why;
- :func:`cu_seqlens_from_doc_ids`, :func:`positions_in_documents`, :func:`packed_attention` (a model's
  attention slot for a packed batch);
- :class:`FlashAttention2Triton`, :class:`FlashAttention2PyTorch` (``torch.autograd.Function``;
  ``apply(q, k, v, is_causal=False, window=None)``, saving the log-sum-exp ``L (..., seq_q)``);
- :func:`reference` (plain attention returning ``(o, lse)``).

What each kernel set supports (``window=(left, right)``: keys ``i + shift - left ... i + shift + right``,
``shift = seq_k - seq_q``; ``is_causal`` caps ``right`` at 0):

| feature | sm90 (Gluon) | portable (Triton) | pytorch (tiled) |
| --- | --- | --- | --- |
| devices | H100 / H200 (sm_90) | NVIDIA GPUs from sm_80; CPU under ``TRITON_INTERPRET=1`` | any |
| dtypes | fp16, bf16 | fp16, bf16, fp32 (tf32x3 dots) | fp16, bf16, fp32, fp64 |
| head dims | 64, 128 | multiples of 8, 16 ... 256 | multiples of 8, 16 ... 256 |
| GQA / MQA (``H_q % H_kv == 0``) | yes | yes, K/V never expanded | yes (broadcast views) |
| causal (bottom-right), ``window`` | yes (every query must see a key) | yes, tiles outside skipped | yes |
| packed documents (varlen) | no | yes | yes (a loop over documents) |
| deterministic backward | yes (no atomics) | yes (no atomics) | yes |

Calls take the first set of the table that covers them (sm90, then portable, then pytorch), forward and
backward alike: on sm90 both passes run the Gluon kernels, windows included. Unsupported inputs
raise ``TypeError`` / ``ValueError`` naming the argument and the supported values; a CUDA call that falls back
to the PyTorch version warns once with the reason.
"""

import importlib

_EXPORTS = {
    "flash_attention": "flashattn.attention",
    "flash_attention_varlen": "flashattn.varlen",
    "cu_seqlens_from_doc_ids": "flashattn.varlen",
    "positions_in_documents": "flashattn.varlen",
    "packed_attention": "flashattn.varlen",
    "choose": "flashattn.dispatch",
    "FlashAttention2Triton": "flashattn.triton_flash",
    "FlashAttention2PyTorch": "flashattn.pytorch_flash",
    "reference": "flashattn.plain",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.2.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'flashattn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
