"""Which implementation a call takes and why (:func:`choose`); the dense entry point :func:`flash_attention`.

Paths are tried in the order of :data:`PATHS`; each names why it cannot take a call (``None``: it can). The
tiled PyTorch version takes everything the input checks accept and ends the list. A CUDA call that ends up
there warns once per reason (it is orders of magnitude slower); CPU calls have no faster path and do not warn.

The Triton path runs one of two kernel sets for each pass (:func:`triton_kernels`): the sm90 kernels of
:mod:`flashattn.hopper` where they cover the call (H100/H200, bf16/fp16, head dims 64 and 128, not packed;
sliding windows included), else the portable ones. Both read and write the same saved ``O`` and ``L``, so
the backward is chosen on its own: :data:`HOPPER_FORWARD` and :data:`HOPPER_BACKWARD` name the kernels that
measured fastest.
"""

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
from torch import Tensor

from flashattn.inputs import Window, as_4d, check_window
from flashattn.pinning import Pin

FORWARD_KERNELS = ("hopper", "gluon", "portable")  # "gluon": the warp-specialised sm90 forward
# "hopper5": five tile products, dQ from dK/dV; "gluon": the warp-specialised dQ and dK/dV kernels;
# "gluon5": the warp-specialised five-product kernel (dQ added in L2 in a fixed order)
BACKWARD_KERNELS = ("hopper", "hopper5", "gluon", "gluon5", "portable")
# The sm90 forward and, per head dim, the backward that follows it, with the measurements behind them
# (`python -m flashattn.bench` times every kernel set in one run; docs/flashattn.md, Hopper section).
HOPPER_FORWARD = "gluon"
HOPPER_FORWARD_WHY = "on the H200 it ran 1.14-1.22x faster than the Triton-language Hopper forward"
HOPPER_BACKWARD = {64: "gluon", 128: "gluon"}
HOPPER_BACKWARD_WHY = {
    64: "at (4, 16, 4096, 64) the Gluon backward ran 1.09-1.15x faster than the Triton-language Hopper one,"
    " which ran 1.24-1.36x faster than the portable one",
    128: "at (1, 32, 8192, 128) causal the Gluon backward ran 1.34x faster than the portable one, which"
    " tied with the Triton-language Hopper ones",
}
WINDOW_WHY = ("windows: on the H200 the Gluon forward ran 1.13-1.55x and the Gluon backward 1.31-1.82x as"
              " fast as the portable kernels at d 64 and 128")  # fmt: skip
_pin: Pin[tuple[str, str]] = Pin()


class Choice(NamedTuple):
    """The implementation a call takes (``"triton"``, ``"pytorch"``), the reason in words, and the kernels
    its forward and backward run (:data:`FORWARD_KERNELS`, :data:`BACKWARD_KERNELS` or ``"pytorch"``)."""

    name: str
    reason: str
    forward: str
    backward: str


def pinned_kernels(forward: str, backward: str) -> AbstractContextManager[None]:
    """Run ``forward`` (one of :data:`FORWARD_KERNELS`) and ``backward`` (:data:`BACKWARD_KERNELS`) for every
    Triton call inside the ``with`` block that the Hopper path covers (the benchmark's columns, tests); others
    stay portable. The backward is fixed when the forward runs: only the forward call need be inside."""
    for name, kernel, kernels in (
        ("forward", forward, FORWARD_KERNELS),
        ("backward", backward, BACKWARD_KERNELS),
    ):
        if kernel not in kernels:
            raise ValueError(f"{name} must be one of {kernels}, got {kernel!r}")
    return _pin.pinned((forward, backward))


def triton_kernels(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window = None, varlen: bool = False
) -> tuple[str, str, str]:
    """``(forward, backward, why)``: the kernels :class:`flashattn.FlashAttention2Triton` runs for a call,
    (:data:`FORWARD_KERNELS`, :data:`BACKWARD_KERNELS`), and the reason in words."""
    from flashattn import hopper

    if varlen:
        reason = "packed documents are not covered"
    elif not all(isinstance(t, Tensor) and t.ndim >= 2 for t in (q, k, v)):
        reason = "q, k, v are not (..., seq, d) tensors"
    else:
        reason = hopper.unsupported_reason(as_4d(q), as_4d(k), as_4d(v), is_causal)
        if reason is None and window is not None:
            reason = hopper.window_reason(q.shape[-2], k.shape[-2], is_causal, window)
    if reason is not None:
        return "portable", "portable", f"portable forward and backward (hopper: {reason})"
    pinned = _pin.value
    if window is not None:  # of the sm90 kernels only the Gluon ones take windows
        if pinned is None:
            forward, backward, why = "gluon", "gluon", WINDOW_WHY
        else:  # a pinned kernel other than the Gluon ones runs portable
            forward, backward = (name if name == "gluon" else "portable" for name in pinned)
            why = "pinned"
        return forward, backward, f"{forward} forward, {backward} backward ({why})"
    if pinned is not None:
        return *pinned, f"{pinned[0]} forward, {pinned[1]} backward (pinned)"
    head_dim = q.shape[-1]
    backward = HOPPER_BACKWARD[head_dim]
    why = f"{HOPPER_FORWARD} forward ({HOPPER_FORWARD_WHY}), "
    return HOPPER_FORWARD, backward, why + f"{backward} backward ({HOPPER_BACKWARD_WHY[head_dim]})"


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
            forward, backward, kernels = triton_kernels(q, k, v, is_causal, window, varlen)
            why = f"{name} takes {str(q.dtype)[6:]} on {q.device.type}: {kernels}"
            return Choice(name, why + (f" ({'; '.join(refusals)})" if refusals else ""), forward, backward)
        refusals.append(f"{name}: {reason}")
    reason = "pytorch (tiled, slow): " + "; ".join(refusals)
    if q.device.type == "cuda" and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashattn falls back to {reason}", RuntimeWarning, stacklevel=3)
    return Choice("pytorch", reason, "pytorch", "pytorch")


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
