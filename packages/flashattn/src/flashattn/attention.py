"""The dense entry point :func:`flash_attention`: checks, autocast, the plan of the call, then one custom op
(:mod:`flashattn.ops`), so compiled models trace it without a graph break."""

import math

import torch
from torch import Tensor

from flashattn import ops
from flashattn.dispatch import choose, plan
from flashattn.inputs import ANY_FLOAT, Window, as_4d, check_qkv


def autocast_inputs(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Inside ``torch.autocast``, floating tensors other than fp64 in the autocast dtype, as SDPA gets them;
    outside, the tensors unchanged."""
    device = tensors[0].device.type
    if device == "meta" or not torch.is_autocast_enabled(device):  # meta: no autocast, only shapes
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t for t in tensors)


def check_scale(softmax_scale: float | None, head_dim: int) -> float:
    """``softmax_scale`` (default ``1 / sqrt(head_dim)``), refused unless a finite positive number."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, int | float):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None, *,
    softmax_scale: float | None = None, return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """Attention ``o (..., H_q, seq_q, d)`` of ``q``, ``k, v (..., H_kv, seq_k, d)``, differentiable.

    ``window=(left, right)``: query ``i`` sees keys ``i + shift - left ... i + shift + right`` (``shift =
    seq_k - seq_q``); ``is_causal`` caps ``right`` at 0. ``softmax_scale`` multiplies the scores (default
    ``1 / sqrt(d)``). With ``return_lse=True`` also the log-sum-exp of the scaled scores, fp32 ``(...,
    H_q, seq_q)`` (natural log, no gradient). Inside ``torch.autocast`` the inputs are cast as SDPA casts
    them. The kernels come from :func:`flashattn.dispatch.plan` (:func:`flashattn.dispatch.choose` says which
    and why). Matches ``cs336_basics``' attention slot ``(q, k, v, is_causal) -> out``.
    """
    window = check_qkv(q, k, v, is_causal, ANY_FLOAT, window)
    q, k, v = autocast_inputs(q, k, v)
    scale = check_scale(softmax_scale, q.shape[-1])
    q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
    kernels = plan(q4, k4, v4, is_causal, window)
    if kernels.forward == "pytorch" and q.device.type == "cuda":
        choose(q, k, v, is_causal, window)  # warns once with the reasons
    o, lse = ops.attention(
        q4, k4, v4, is_causal, None if window is None else list(window), scale, *kernels
    )
    o, lse = o.reshape(q.shape), lse.reshape(q.shape[:-1])
    return (o, lse) if return_lse else o
