"""Attention over packed documents: :func:`flash_attention_varlen`, cumulative lengths from document ids, and
the attention slot of a model run on a packed batch (:func:`packed_attention`).

Layout (flash-attn's ``flash_attn_varlen_func`` convention): ``q (total_q, H_q, d)``, ``k, v (total_k, H_kv,
d)``, documents one after another; ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 ``(docs + 1,)`` with
``cu[0] = 0``, ``cu[-1] = total``, non-decreasing (empty documents allowed). No query sees a key of another
document; inside a document visibility is that of :mod:`flashattn.inputs` with the document's own lengths.
A query row that sees no key (a document with no keys, or causal with more queries than keys) gives zeros.
"""

import itertools
from collections.abc import Callable

import torch
from torch import Tensor

from flashattn import ops
from flashattn.attention import autocast_inputs, check_scale
from flashattn.dispatch import plan
from flashattn.inputs import ANY_FLOAT, Varlen, Window, check_heads, check_tensors, check_window

AttentionFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]


def cu_seqlens_from_doc_ids(doc_ids: Tensor) -> tuple[Tensor, int]:
    """int32 cumulative lengths ``(docs + 1,)`` (on ``doc_ids``' device) and the longest length, from
    ``doc_ids (total,)``: each run of equal ids is one document."""
    if not isinstance(doc_ids, Tensor) or doc_ids.ndim != 1 or doc_ids.is_floating_point():
        raise ValueError(f"doc_ids must be a 1-D integer tensor, got {getattr(doc_ids, 'shape', doc_ids)!r}")
    total = doc_ids.numel()
    starts = torch.nonzero(doc_ids[1:] != doc_ids[:-1]).flatten() + 1
    ends = torch.tensor([total] if total else [], device=doc_ids.device, dtype=starts.dtype)
    cu = torch.cat([torch.zeros(1, dtype=starts.dtype, device=doc_ids.device), starts, ends]).to(torch.int32)
    return cu, int(cu.diff().max()) if total else 0


def positions_in_documents(cu_seqlens: Tensor) -> Tensor:
    """int64 ``(total,)``: each token's position inside its document (for rotary embeddings); ``cu_seqlens``
    is checked as :func:`flash_attention_varlen` checks it."""
    total = int(cu_seqlens[-1]) if isinstance(cu_seqlens, Tensor) and cu_seqlens.numel() else 0
    device = cu_seqlens.device if isinstance(cu_seqlens, Tensor) else None
    cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", total, total, device).long()
    lengths = cu.diff()
    return torch.arange(total, device=cu.device) - torch.repeat_interleave(
        cu[:-1], lengths, output_size=total
    )


def _check_lengths_on_host(cu: Tensor, name: str, total: int, max_seqlen: int) -> None:
    """Read ``cu`` (one small copy) and refuse it unless it rises from 0 to ``total`` in steps of at most
    ``max_seqlen``."""
    values = cu.tolist()
    lengths = [b - a for a, b in itertools.pairwise(values)]
    if values[0] != 0 or values[-1] != total or min(lengths) < 0:
        raise ValueError(
            f"{name} must rise from 0 to {total} (the packed length), got {values[:4]}...{values[-2:]}"
        )
    if max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen for {name} must be >= the longest document {max(lengths)}, "
                         f"got {max_seqlen}")  # fmt: skip


def _checked_on_device(cu: Tensor, name: str, total: int, max_seqlen: int) -> Tensor:
    """``cu`` clamped into ``[0, total]`` and made non-decreasing, so no kernel reads outside the packed
    tensors whatever its values; a device-side assertion reports a bad ``cu`` without a host sync (the error
    surfaces at the next synchronisation)."""
    lengths = cu.diff()
    ok = (cu[0] == 0) & (cu[-1] == total) & (lengths.min() >= 0) & (lengths.max() <= max_seqlen)
    # a fixed message: under torch.compile total and max_seqlen may be symbolic, and cannot be formatted
    torch._assert_async(ok, f"{name} must rise from 0 to the packed length, no document over max_seqlen")
    return torch.cummax(cu.clamp(0, total), dim=0).values.to(torch.int32)


def check_cu_seqlens(
    cu: Tensor, name: str, total: int, max_seqlen: int, device: torch.device, validate: bool = False
) -> Tensor:
    """``cu``: int32 ``(docs + 1,)`` on ``device``, rising from 0 to ``total``, longest <= ``max_seqlen``.

    The values are read on the host for CPU tensors or with ``validate`` (outside ``torch.compile``); CUDA
    tensors are checked on the device instead, and the returned tensor is clamped so that the kernels stay
    inside the packed tensors even when the check fails."""
    if not isinstance(cu, Tensor) or cu.dtype != torch.int32 or cu.ndim != 1 or cu.numel() < 2:
        what = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, Tensor) else type(cu).__name__
        raise ValueError(f"{name} must be an int32 tensor (docs + 1,) with at least 2 entries, got {what}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; they must match")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"max_seqlen for {name} must be an int >= 0, got {max_seqlen!r}")
    if (cu.device.type == "cpu" or validate) and not torch.compiler.is_compiling():
        _check_lengths_on_host(cu, name, total, max_seqlen)
        return cu.contiguous()  # the kernels index it as contiguous
    return _checked_on_device(cu, name, total, max_seqlen)


def _check(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, validate) -> tuple[Tensor, Tensor]:
    check_tensors(q, k, v, ANY_FLOAT, min_ndim=3)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 3:
            raise ValueError(f"{name} must have shape (total, heads, head_dim), got {tuple(t.shape)}")
    check_heads(q.shape[1], k.shape[1])
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"v has (total, heads) {tuple(v.shape[:2])} but k has {tuple(k.shape[:2])}; they must match"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    cu_q = check_cu_seqlens(cu_q, "cu_seqlens_q", q.shape[0], max_q, q.device, validate)
    cu_k = check_cu_seqlens(cu_k, "cu_seqlens_k", k.shape[0], max_k, q.device, validate)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q has {cu_q.numel()} entries but cu_seqlens_k {cu_k.numel()}; one per document + 1"
        )
    return cu_q, cu_k


def flash_attention_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, is_causal: bool = False, window: Window = None, *, softmax_scale: float | None = None,
    return_lse: bool = False, validate: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """Attention ``(total_q, H_q, d)`` of packed documents, differentiable (layout in the module docstring).

    ``max_seqlen_q/k`` bound the documents' lengths, as in flash-attn; the cumulative lengths are checked on
    the host for CPU tensors (or with ``validate=True``) and on the device otherwise, without a host sync,
    so a compiled step can be captured in a CUDA graph. ``softmax_scale``, ``return_lse`` (fp32 ``(H_q,
    total_q)``) and autocast as :func:`flashattn.flash_attention`.
    """
    window = check_window(window)
    cu_q, cu_k = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, validate)
    q, k, v = autocast_inputs(q, k, v)
    scale = check_scale(softmax_scale, q.shape[-1])
    kernels = plan(q, k, v, is_causal, window, Varlen(cu_q, cu_k, max_seqlen_q, max_seqlen_k))
    o, lse = ops.varlen_attention(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, is_causal,
                                None if window is None else list(window), scale, *kernels)  # fmt: skip
    return (o, lse) if return_lse else o


def packed_attention(cu_seqlens: Tensor, max_seqlen: int, window: Window = None) -> AttentionFn:
    """The attention slot ``(q, k, v, is_causal) -> out`` of a model whose batch ``(B, S)`` packs documents.

    ``q, k, v (B, H, S, d)``: the ``B * S`` tokens, in order, are the documents of ``cu_seqlens`` (int32, on
    the inputs' device); no token attends across a boundary. Pair it with
    ``token_positions=positions_in_documents(cu_seqlens)`` so rotary positions restart in each document.
    """
    window = check_window(window)
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be a 1-D int32 tensor (docs + 1,), got {cu_seqlens!r}")

    def attend(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.ndim != 4:
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must be (batch, heads, seq, head_dim) for packed_attention, got "
                                 f"{shape}")
        batch, _, seq, _ = q.shape
        packed = [t.transpose(1, 2).reshape(batch * seq, t.shape[1], t.shape[3]) for t in (q, k, v)]
        out = flash_attention_varlen(
            *packed, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal, window
        )
        return out.reshape(batch, seq, *out.shape[1:]).transpose(1, 2)

    return attend
