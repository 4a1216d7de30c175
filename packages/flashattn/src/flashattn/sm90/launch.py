"""The sm90 path: which calls it covers (:func:`unsupported_reason`) and its launchers (:func:`forward`,
:func:`backward`) over the warp-specialised Gluon kernels of :mod:`.fwd`, :mod:`.dq` and :mod:`.dkdv`.

Covers CUDA tensors on a compute-capability-9.0 GPU (H100, H200: the kernels use wgmma, which exists only
there), bf16 or fp16, head dims 64 and 128, causal or not (bottom-right aligned), any lengths >= 1, GQA
(``H_q % H_kv == 0``) and sliding windows in which every query sees a key. It reads and writes the same
saved ``lse`` (fp32 ``(B, H, seq_q)``, natural log) as the portable kernels, so either backward can follow
either forward. Deterministic: no data is added atomically; every output element is summed in a fixed order.
One compiled kernel per (head dim, dtype, causal, window, tile) serves every length and head count.
"""

import functools
import math

import torch
import triton
from torch import Tensor

from flashattn.inputs import Window, right_bound
from flashattn.portable.fwd import INTERPRETED
from flashattn.sm90.tiles import CONSUMERS, TILES, DkdvTile, DqTile, ForwardTile, max_registers

LOG2E = math.log2(math.e)
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = tuple(TILES)


def capability_reason(capability: tuple[int, int]) -> str | None:
    """None for compute capability (9, 0), else why the sm90 kernels cannot run there."""
    if tuple(capability) != (9, 0):
        return f"the GPU has compute capability {tuple(capability)}; the sm90 path needs (9, 0)"
    return None


def device_reason(device: torch.device) -> str | None:
    """Why tensors on ``device`` cannot take the sm90 kernels (not CUDA, the interpreter, not sm90)."""
    if device.type != "cuda":
        return f"q is on {device}; the sm90 path needs CUDA tensors"
    if INTERPRETED:
        return "TRITON_INTERPRET=1 is set; interpreted calls take the portable kernels"
    props = torch.cuda.get_device_properties(device)  # cached by torch; constant to torch.compile
    return capability_reason((props.major, props.minor))


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window) -> str | None:
    """Why the sm90 path cannot take checked ``(B, H, S, d)`` inputs, or None when it can."""
    if q.dtype not in DTYPES:
        return f"q has dtype {q.dtype}; the sm90 path takes bfloat16 or float16"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}; the sm90 path takes head dims {HEAD_DIMS}"
    if (reason := window_reason(q.shape[2], k.shape[2], is_causal, window)) is not None:
        return reason
    return device_reason(q.device)


def window_reason(seq_q: int, seq_k: int, is_causal: bool, window: Window) -> str | None:
    """Why the kernels cannot take ``window`` for these lengths, or None: they need every query to see a
    key."""
    if window is not None and seq_k - seq_q + (right := right_bound(is_causal, window)) < 0:
        return f"window {window} leaves the first {seq_q - seq_k - right} queries without keys"
    return None


def _band(is_causal: bool, window: Window) -> dict:
    """The kernels' window arguments: ``left``, ``right`` (0 where absent) and ``WINDOW``."""
    return {"left": window[0] if window else 0, "right": right_bound(is_causal, window) or 0,
            "WINDOW": window is not None}  # fmt: skip


def _tma_ready(t: Tensor) -> Tensor:
    """``t`` itself when the copy engine can read it (unit last stride, 16-byte aligned), else a copy."""
    row_bytes_ok = all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
    if t.stride(-1) == 1 and row_bytes_ok and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous()


@functools.cache
def _shared_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The default shared-memory swizzle of a ``(1, 1, rows, head_dim)`` block (cached: building it costs
    tens of microseconds of host time, several times per call)."""
    from triton.experimental.gluon import language as gl

    gluon_dtype = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], gluon_dtype)


def descriptor(t: Tensor, rows: int):
    """A TMA descriptor of ``t (B, H, S, d)`` with ``(1, 1, rows, d)`` blocks in the default swizzle."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    head_dim = t.shape[-1]
    return TensorDescriptor.from_tensor(t, [1, 1, rows, head_dim], _shared_layout(rows, head_dim, t.dtype))


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window, scale: float,
    tile: ForwardTile | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``o`` ``(B, H, Sq, d)`` (q's layout) and fp32 ``lse`` ``(B, H, Sq)`` (natural log) of inputs that
    :func:`unsupported_reason` accepts; ``scale`` multiplies the scores; ``tile`` defaults to the table's."""
    from flashattn.sm90.fwd import gluon_fwd_kernel

    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    t = tile or TILES[head_dim].forward
    o = torch.empty_like(q)  # q's layout, e.g. the (B, S, H, d) storage of attention layers
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    n_items = triton.cdiv(seq_q, CONSUMERS * t.block_m) * batch * heads
    programs = min(n_items, _sm_count(q.device)) if t.persistent else n_items
    claims = torch.zeros(1, dtype=torch.int32, device=q.device) if t.persistent else lse  # lse: not read
    gluon_fwd_kernel[(programs,)](
        descriptor(q, t.block_m), descriptor(k, t.block_n), descriptor(v, t.block_n),
        descriptor(o, t.block_m), lse, claims, n_items, heads, heads // heads_k, seq_q, seq_k,
        qk_scale=LOG2E * scale,
        HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, STAGES=t.stages, CAUSAL=is_causal,
        PERSISTENT=t.persistent, num_warps=4, maxnreg=max_registers(), **_band(is_causal, window),
    )  # fmt: skip
    return o, lse


def backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, window: Window,
    scale: float, dq_tile: DqTile | None = None, dkdv_tile: DkdvTile | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``dq, dk, dv`` (in the layouts of ``q, k, v``) from the forward's ``o`` and ``lse`` ``(B, H, Sq)``:
    the dQ kernel (which also writes ``D = rowsum(O dO)``), then the dK/dV kernel; tiles default to the
    table's."""
    from flashattn.sm90.dkdv import gluon_dkdv_kernel
    from flashattn.sm90.dq import gluon_dq_kernel

    q, k, v, o, do = (_tma_ready(t) for t in (q, k, v, o, do))
    lse = lse.contiguous()
    dq, dk, dv, delta = (torch.empty_like(t) for t in (q, k, v, lse))
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    tiles = TILES[head_dim]
    t, g = dq_tile or tiles.dq, dkdv_tile or tiles.dkdv
    desc = functools.cache(descriptor)  # one per (tensor, rows): the two kernels share most
    common = {"qk_scale": LOG2E * scale, "sm_scale": scale, "HEAD_DIM": head_dim, "CAUSAL": is_causal,
              "num_warps": 4, "maxnreg": max_registers(), **_band(is_causal, window)}  # fmt: skip
    gluon_dq_kernel[(triton.cdiv(seq_q, CONSUMERS * t.block_m) * batch * heads,)](
        desc(q, t.block_m), desc(k, t.block_n), desc(v, t.block_n), desc(o, t.block_m), desc(do, t.block_m),
        desc(dq, t.block_m), lse, delta, heads, heads // heads_k, seq_q, seq_k,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, STAGES=t.stages, OVERLAP=t.overlap, **common,
    )  # fmt: skip
    gluon_dkdv_kernel[(triton.cdiv(seq_k, CONSUMERS * g.block_n) * batch * heads_k,)](
        desc(q, g.block_m), desc(k, g.block_n), desc(v, g.block_n), desc(do, g.block_m), desc(dk, g.block_n),
        desc(dv, g.block_n), lse, delta, heads, heads // heads_k, seq_q, seq_k,
        BLOCK=g.block_n, BLOCK_M=g.block_m, STAGES=g.stages,
        TILE_MAJOR=g.gqa_tile_major and is_causal and heads_k < heads, **common,
    )  # fmt: skip
    return dq, dk, dv
