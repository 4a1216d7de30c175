"""FlashAttention-2 in tiled PyTorch and in Triton (forward and backward), a plain reference, and benchmarks.

Public names (imported on first use, so ``import flashattn`` and every command's ``--help`` stay light):

- :func:`flash_attention` ``(q, k, v, is_causal=False, window=None)`` on ``(..., H, seq, d)``: the best path
  for the inputs (:func:`flashattn.dispatch.choose` says which and why);
- :func:`flash_attention_varlen` ``(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  is_causal=False, window=None)`` on packed ``(total, H, d)`` documents; :func:`cu_seqlens_from_doc_ids`,
  :func:`positions_in_documents` and :func:`packed_attention` (a model's attention slot for a packed batch);
- :class:`FlashAttention2Triton`, :class:`FlashAttention2PyTorch` (``torch.autograd.Function``;
  ``apply(q, k, v, is_causal=False, window=None)``, saving the log-sum-exp ``L (..., seq_q)``);
- :func:`reference` (plain attention returning ``(o, lse)``).

What each path supports (``window=(left, right)``: keys ``i + shift - left ... i + shift + right``,
``shift = seq_k - seq_q``; ``is_causal`` caps ``right`` at 0):

| feature | Triton (portable) | PyTorch (tiled) | Hopper (sm90) |
| --- | --- | --- | --- |
| devices | CUDA (CPU under ``TRITON_INTERPRET=1``) | any | H100 / H200 |
| dtypes | fp16, bf16, fp32 (tf32x3 dots) | fp16, bf16, fp32, fp64 | fp16, bf16 |
| head dims | multiples of 8, 16 ... 256 | multiples of 8, 16 ... 256 | 64, 128 |
| GQA / MQA (``H_q % H_kv == 0``) | yes, K/V never expanded | yes (broadcast views) | yes |
| causal (bottom-right) | yes | yes | yes |
| ``window`` | yes, tiles outside skipped | yes | no (falls back to Triton) |
| packed documents (varlen) | yes | yes (a loop over documents) | no (falls back to Triton) |
| deterministic backward | yes (no atomics) | yes | yes (no atomics) |
| in ``FlashAttention2Triton`` | everywhere else | | Gluon forward; backward Hopper (d 64), portable (128) |

Unsupported inputs raise ``TypeError`` / ``ValueError`` naming the argument and the supported values; a CUDA
call that falls back to the PyTorch version warns once with the reason.
"""

import importlib

_EXPORTS = {
    "flash_attention": "flashattn.dispatch",
    "flash_attention_varlen": "flashattn.varlen",
    "cu_seqlens_from_doc_ids": "flashattn.varlen",
    "positions_in_documents": "flashattn.varlen",
    "packed_attention": "flashattn.varlen",
    "FlashAttention2Triton": "flashattn.triton_flash",
    "FlashAttention2PyTorch": "flashattn.pytorch_flash",
    "reference": "flashattn.plain",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'flashattn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
