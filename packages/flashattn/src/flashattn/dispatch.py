"""Which kernels a call runs (:func:`plan`) and why (:func:`choose`).

The kernel sets of :data:`flashattn.kernels.KERNELS` are tried in the order of :data:`ORDER`; the first that
can take a call runs its forward and its backward. Measured on an H200 (docs/flashattn.md): the sm90 Gluon
kernels ran 1.12-1.60x the portable ones on every cell of the benchmark's list (forward and backward, d 64 and
128, causal or not, GQA, windows), so they come first where they apply. The tiled PyTorch version takes
everything the input checks accept and ends the list; a CUDA call that ends up there warns once per reason
(it is orders of magnitude slower), CPU calls have no faster path and do not warn.

:func:`plan` is what a call computes (no strings); :func:`choose` builds the reasons, for people.
"""

import warnings
from typing import NamedTuple

from torch import Tensor

from flashattn.inputs import ANY_FLOAT, Varlen, Window, as_4d, check_tensors, check_window
from flashattn.kernels import KERNELS

ORDER = ("sm90", "portable", "pytorch")


class Plan(NamedTuple):
    """The kernel sets a call's forward and backward run (names of :data:`flashattn.kernels.KERNELS`)."""

    forward: str
    backward: str


class Choice(NamedTuple):
    """:class:`Plan` with the reason in words: why the first sets that were tried could not take the call."""

    forward: str
    backward: str
    reason: str


def plan(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window, varlen: Varlen | None = None
) -> Plan:
    """The first kernel set of :data:`ORDER` that takes checked ``(B, H, S, d)`` (or packed) inputs."""
    for name in ORDER:
        if KERNELS[name].why_not(q, k, v, is_causal, window, varlen) is None:
            return Plan(name, name)
    raise AssertionError("the pytorch kernels take every checked call")


def choose(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None, varlen: bool = False
) -> Choice:
    """Which kernels :func:`flashattn.flash_attention` (``varlen=False``, ``(..., H, S, d)`` inputs) or
    :func:`flashattn.flash_attention_varlen` (``varlen=True``, ``(total, H, d)``) runs for these inputs, and
    why; warns once per reason when a CUDA call falls back to the PyTorch version."""
    check_tensors(q, k, v, ANY_FLOAT, min_ndim=3 if varlen else 2)  # types, dtypes, devices, head dims
    window = check_window(window)
    packed = Varlen(q, k, q.shape[0], k.shape[0]) if varlen else None  # the reasons read no lengths
    views = (q, k, v) if varlen else (as_4d(q), as_4d(k), as_4d(v))
    refusals = []
    for name in ORDER:
        reason = KERNELS[name].why_not(*views, is_causal, window, packed)
        if reason is None:
            break
        refusals.append(f"{name}: {reason}")
    what = f"{name} kernels take {str(q.dtype).removeprefix('torch.')} on {q.device.type}"
    why = f"{what} ({'; '.join(refusals)})" if refusals else what
    if name == "pytorch" and q.device.type == "cuda":
        _warn_once(f"flashattn falls back to the PyTorch version (slow): {'; '.join(refusals)}")
    return Choice(name, name, why)


def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)  # the warnings filter shows each message once
