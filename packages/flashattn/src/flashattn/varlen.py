"""Attention over packed documents: :func:`flash_attention_varlen`, cumulative lengths from document ids, and
the attention slot of a model run on a packed batch (:func:`packed_attention`).

Layout (flash-attn's ``flash_attn_varlen_func`` convention): ``q (total_q, H_q, d)``, ``k, v (total_k, H_kv,
d)``, documents one after another; ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 ``(docs + 1,)`` with
``cu[0] = 0``, ``cu[-1] = total``, non-decreasing (empty documents allowed). No query sees a key of another
document; inside a document visibility is that of :mod:`flashattn.inputs` with the document's own lengths.
A query row that sees no key (a document with no keys, or causal with more queries than keys) gives zeros.
"""

import itertools
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from flashattn.dispatch import choose
from flashattn.inputs import Window, check_heads, check_tensors, check_window, right_bound

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
    """int64 ``(total,)``: each token's position inside its document (for rotary embeddings)."""
    cu = cu_seqlens.long()
    lengths = cu.diff()
    total = int(cu[-1])
    return torch.arange(total, device=cu.device) - torch.repeat_interleave(
        cu[:-1], lengths, output_size=total
    )


# id(cu) -> (weak reference to cu, cu._version, packed total, longest document) of the tensors whose values
# were checked, so a model that passes one cu_seqlens to every layer reads it on the host once
_checked: dict[int, tuple[weakref.ref, int, int, int]] = {}


def _longest(cu: Tensor, name: str, total: int) -> int:
    """The longest document of ``cu`` after checking it rises from 0 to ``total``; read on the host once per
    tensor and total (again after an in-place change, which bumps ``cu._version``)."""
    seen = _checked.get(id(cu))
    if seen is not None and seen[0]() is cu and seen[1:3] == (cu._version, total):
        return seen[3]
    values = cu.tolist()
    lengths = [b - a for a, b in itertools.pairwise(values)]
    if values[0] != 0 or values[-1] != total or min(lengths) < 0:
        raise ValueError(
            f"{name} must rise from 0 to {total} (the packed length), got {values[:4]}...{values[-2:]}"
        )
    key = id(cu)
    _checked[key] = (weakref.ref(cu, lambda _, key=key: _checked.pop(key, None)), cu._version, total,
                     max(lengths))  # fmt: skip
    return max(lengths)


def check_cu_seqlens(cu: Tensor, name: str, total: int, max_seqlen: int, device: torch.device) -> None:
    """``cu``: int32 ``(docs + 1,)`` on ``device``, rising from 0 to ``total``, longest <= ``max_seqlen``.

    The values are read on the host (one small copy) the first time a tensor is checked, and again only after
    it changes in place."""
    if not isinstance(cu, Tensor) or cu.dtype != torch.int32 or cu.ndim != 1 or cu.numel() < 2:
        what = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, Tensor) else type(cu).__name__
        raise ValueError(f"{name} must be an int32 tensor (docs + 1,) with at least 2 entries, got {what}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; they must match")
    longest = _longest(cu, name, total)
    if not isinstance(max_seqlen, int) or longest > max_seqlen:
        raise ValueError(f"max_seqlen for {name} must be an int >= the longest document {longest}, "
                         f"got {max_seqlen!r}")  # fmt: skip


def _check(q, k, v, cu_q, cu_k, max_q, max_k, is_causal) -> None:
    check_tensors(q, k, v, (torch.float16, torch.bfloat16, torch.float32, torch.float64), min_ndim=3)
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
    check_cu_seqlens(cu_q, "cu_seqlens_q", q.shape[0], max_q, q.device)
    check_cu_seqlens(cu_k, "cu_seqlens_k", k.shape[0], max_k, q.device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q has {cu_q.numel()} entries but cu_seqlens_k {cu_k.numel()}; one per document"
        )


def _pytorch_varlen(q, k, v, cu_q, cu_k, is_causal: bool, window: Window) -> Tensor:
    """One tiled-PyTorch call per document; rows that see no key (a prefix of the document) are zeros."""
    from flashattn.pytorch_flash import FlashAttention2PyTorch

    right = right_bound(is_causal, window)
    pieces = []
    for q0, q1, k0, k1 in zip(
        cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(), cu_k.tolist()[1:], strict=False
    ):
        n_q, n_k = q1 - q0, k1 - k0
        blind = n_q if n_k == 0 else (0 if right is None else min(n_q, max(0, n_q - n_k - right)))
        if blind:
            pieces.append(q.new_zeros(blind, *q.shape[1:]))
        if blind < n_q:
            heads_first = (t.transpose(0, 1) for t in (q[q0 + blind : q1], k[k0:k1], v[k0:k1]))
            pieces.append(FlashAttention2PyTorch.apply(*heads_first, is_causal, window).transpose(0, 1))
    return torch.cat(pieces) if pieces else q.new_zeros(q.shape)


def _run(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window) -> Tensor:
    if choose(q, k, v, is_causal, window, varlen=True).name == "triton":
        from flashattn.triton_flash import FlashAttentionVarlenTriton

        return FlashAttentionVarlenTriton.apply(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window)
    return _pytorch_varlen(q, k, v, cu_q, cu_k, is_causal, window)


@torch.compiler.disable
def flash_attention_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, is_causal: bool = False, window: Window = None,
) -> Tensor:  # fmt: skip
    """Attention ``(total_q, H_q, d)`` of packed documents with autograd (layout in the module docstring).

    Checks the cumulative lengths on the host the first time each tensor is seen (one small copy), so passing
    the same ``cu_seqlens`` to every layer of a model reads it once.
    """
    window = check_window(window)
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal)
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, window)


def packed_attention(cu_seqlens: Tensor, max_seqlen: int, window: Window = None) -> AttentionFn:
    """The attention slot ``(q, k, v, is_causal) -> out`` of a model whose batch ``(B, S)`` packs documents.

    ``q, k, v (B, H, S, d)``: the ``B * S`` tokens, in order, are the documents of ``cu_seqlens`` (int32, on
    the inputs' device); no token attends across a boundary. Pair it with
    ``token_positions=positions_in_documents(cu_seqlens)`` so rotary positions restart in each document.
    """
    window = check_window(window)
    total = int(cu_seqlens[-1]) if isinstance(cu_seqlens, Tensor) and cu_seqlens.numel() else -1
    check_cu_seqlens(cu_seqlens, "cu_seqlens", total, max_seqlen, cu_seqlens.device)

    def attend(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
        batch, _, seq, _ = q.shape
        if batch * seq != total:
            raise ValueError(f"q has {batch} x {seq} tokens but cu_seqlens packs {total}")
        packed = [t.transpose(1, 2).reshape(batch * seq, t.shape[1], t.shape[3]) for t in (q, k, v)]
        _check(*packed, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal)  # values read once, above
        out = _run(*packed, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, is_causal, window)
        return out.reshape(batch, seq, *out.shape[1:]).transpose(1, 2)

    return torch.compiler.disable(attend)
