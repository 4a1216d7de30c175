"""Which implementation a call takes and why (:func:`choose`); the dense entry point :func:`flash_attention`.

Paths are tried in the order of :data:`PATHS`; each names why it cannot take a call (``None``: it can). The
tiled PyTorch version takes everything the input checks accept and ends the list. A CUDA call that ends up
there warns once per reason (it is orders of magnitude slower); CPU calls have no faster path and do not warn.
A faster path for some inputs (an sm90 kernel, say) goes first in :data:`PATHS` with a reason function that
refuses what it does not cover (``window is not None``, ``varlen``, other head dims or dtypes), so those calls
fall through to Triton.
"""

import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from flashattn.inputs import Window, check_window


class Choice(NamedTuple):
    """The implementation a call takes (``"triton"``, ``"pytorch"``) and the reason, in words."""

    name: str
    reason: str


def _triton_reason(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window, varlen: bool
) -> str | None:
    from flashattn.triton_flash import unsupported_reason

    return unsupported_reason(q)


# (name, why it cannot take a call); the first that can, wins.
PATHS: list[tuple[str, Callable[..., str | None]]] = [("triton", _triton_reason)]
_warned: set[str] = set()


def choose(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None, varlen: bool = False
) -> Choice:
    """The path :func:`flash_attention` (``varlen=False``) or :func:`flashattn.flash_attention_varlen`
    (``varlen=True``) takes for these inputs, with the reason; warns once when a CUDA call falls back."""
    window = check_window(window)
    refusals = []
    for name, why_not in PATHS:
        reason = why_not(q, k, v, is_causal, window, varlen)
        if reason is None:
            why = f"{name} takes {str(q.dtype)[6:]} on {q.device.type}"
            return Choice(name, why + (f" ({'; '.join(refusals)})" if refusals else ""))
        refusals.append(f"{name}: {reason}")
    reason = "pytorch (tiled, slow): " + "; ".join(refusals)
    if q.device.type == "cuda" and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashattn falls back to {reason}", RuntimeWarning, stacklevel=3)
    return Choice("pytorch", reason)


@torch.compiler.disable
def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None
) -> Tensor:
    """Attention ``(..., H_q, seq_q, d)`` of ``q``, ``k, v (..., H_kv, seq_k, d)`` with autograd.

    ``window=(left, right)``: query ``i`` sees keys ``i + shift - left ... i + shift + right`` (``shift =
    seq_k - seq_q``); ``is_causal`` caps ``right`` at 0. The path comes from :func:`choose`. Matches
    ``cs336_basics``' attention slot ``(q, k, v, is_causal) -> out``; ``torch.compile`` treats it as an opaque
    call (a graph break), so compiled models run the kernels unchanged.
    """
    name = choose(q, k, v, is_causal, window).name
    if name == "triton":
        from flashattn.triton_flash import FlashAttention2Triton as Impl
    else:
        from flashattn.pytorch_flash import FlashAttention2PyTorch as Impl
    return Impl.apply(q, k, v, is_causal, window)
