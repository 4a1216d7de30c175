"""The Hopper (sm90) attention path: which calls it covers, and its forward and backward launchers.

Covers CUDA tensors on a compute-capability-9.0 GPU, bf16 or fp16, head dims 64 and 128, causal or not (causal
needs ``seq_q <= seq_k``, bottom-right aligned), any lengths >= 1, and GQA (``k, v`` with ``H_kv`` heads,
``H_q % H_kv == 0``). :func:`unsupported_reason` says why a call is not covered; the caller then takes the
portable kernel of :mod:`flashattn.triton_flash`, whose saved ``lse`` (fp32 ``(batch, heads, seq_q)``, natural
log) this path reads and writes unchanged, so either backward can follow either forward.

Launchers: :func:`forward` and :func:`backward` (Triton-language kernels of :mod:`flashattn.hopper_fwd` and
:mod:`flashattn.hopper_bwd`; they also run under ``TRITON_INTERPRET=1``, fp16 only, for the CPU tests, though
:func:`unsupported_reason` sends interpreted calls to the portable path), :func:`backward5` (five tile
products, :mod:`flashattn.hopper_bwd5`), and the warp-specialised Gluon kernels, GPU only:
:func:`gluon_forward` (:mod:`flashattn.gluon_fwd`), :func:`gluon_backward` (:mod:`flashattn.gluon_dq`, then
:mod:`flashattn.gluon_bwd`) and :func:`gluon_backward5` (five tile products, :mod:`flashattn.gluon_bwd5`).
Which of them the public names run is :func:`flashattn.dispatch.triton_kernels`'s choice. Deterministic: no
data is added atomically (only the five-product backwards' turn counters are), every output element is
summed in a fixed order. One compiled kernel per (head dim, dtype, causal, tile config) serves every
length and head count; the launch shapes are :mod:`flashattn.hopper_tiles`'s.
"""

import functools
import math

import torch
import triton
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from flashattn.hopper_bwd import dkdv_kernel, dq_kernel
from flashattn.hopper_bwd5 import TURN_STRIDE, delta_kernel, dkdvdq_kernel
from flashattn.hopper_fwd import fwd_kernel
from flashattn.hopper_tiles import GluonTile, HopperTile, configs_for
from flashattn.inputs import Window, check_window, right_bound
from flashattn.interpret import check_interpreted

LOG2E = math.log2(math.e)
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128)


def _shape_reason(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> str | None:
    """Why the tensors' dtypes and shapes are outside this path, or None."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            return f"{name} is a {type(t).__name__}, not a torch.Tensor"
        if t.ndim != 4:
            return f"{name} has shape {tuple(t.shape)}; the Hopper path takes (batch, heads, seq, head_dim)"
        if t.dtype not in DTYPES:
            return f"{name} has dtype {t.dtype}; the Hopper path takes bfloat16 or float16"
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        return "q, k and v differ in dtype or device"
    if k.shape != v.shape:
        return f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}; they must match"
    (batch, heads, seq_q, head_dim), (batch_k, heads_k, seq_k, head_dim_k) = q.shape, k.shape
    if head_dim not in HEAD_DIMS or head_dim_k != head_dim:
        return f"head dims q {head_dim}, k {head_dim_k}; the Hopper path takes {HEAD_DIMS}, equal"
    if batch_k != batch or heads_k < 1 or heads % heads_k:
        return f"k has (batch, heads) ({batch_k}, {heads_k}); needs batch {batch} and heads dividing {heads}"
    if min(batch, heads, seq_q, seq_k) < 1:
        return f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}"
    if is_causal and seq_q > seq_k:
        return f"is_causal=True needs seq_q <= seq_k (bottom-right alignment), got {seq_q} > {seq_k}"
    return None


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> str | None:
    """None when the Hopper path covers ``attention(q, k, v, is_causal)``, else a sentence saying why not."""
    if not isinstance(is_causal, bool):
        return f"is_causal is a {type(is_causal).__name__}, not a bool"
    reason = _shape_reason(q, k, v, is_causal)
    if reason is not None:
        return reason
    return device_reason(q.device)


def device_reason(device: torch.device) -> str | None:
    """Why tensors on ``device`` cannot take the Hopper kernels (not CUDA, the interpreter, not sm90)."""
    if device.type != "cuda":
        return f"q is on {device}; the Hopper path needs CUDA tensors"
    if triton.knobs.runtime.interpret:
        return "TRITON_INTERPRET=1 is set; interpreted calls take the portable kernel"
    return capability_reason(torch.cuda.get_device_capability(device))


def capability_reason(capability: tuple[int, int]) -> str | None:
    """None for compute capability (9, 0) (H100, H200), else why not: the kernels' wgmma exists only there."""
    if tuple(capability) != (9, 0):
        return f"the GPU has compute capability {tuple(capability)}; the Hopper path needs (9, 0)"
    return None


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> None:
    reason = _shape_reason(q, k, v, is_causal)
    if reason is not None:
        raise ValueError(reason)


def _check_device(q: Tensor) -> None:
    if q.device.type != "cuda" and not triton.knobs.runtime.interpret:
        raise ValueError(f"q is on {q.device}; the Hopper kernels need CUDA tensors (or TRITON_INTERPRET=1)")
    check_interpreted(q)


def _tma_ready(t: Tensor) -> Tensor:
    """``t`` itself when the copy engine can read it (unit last stride, 16-byte aligned), else a copy."""
    row_bytes_ok = all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
    if t.stride(-1) == 1 and row_bytes_ok and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous()


def _desc(t: Tensor, rows: int) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, [1, 1, rows, t.shape[-1]])


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _n_programs(work: int, tile: HopperTile | GluonTile, device: torch.device) -> int:
    if not tile.persistent:
        return work
    if device.type != "cuda":  # the interpreter: a few programs still exercise the striding
        return min(work, 4)
    return min(work, _sm_count(device.index if device.index is not None else torch.cuda.current_device()))


def _opts(tile: HopperTile) -> dict:
    return {"num_warps": tile.num_warps, "num_stages": tile.num_stages}


def forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    """``o`` ``(B, H, Sq, d)`` (q's dtype and layout) and fp32 ``lse`` ``(B, H, Sq)`` (natural log)."""
    _check_shapes(q, k, v, is_causal)
    _check_device(q)
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    tile = configs_for(head_dim).forward
    o = torch.empty_like(q)  # q's layout, e.g. the (B, S, H, d) storage of attention layers
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    work = triton.cdiv(seq_q, tile.block_m) * batch * heads
    fwd_kernel[(_n_programs(work, tile, q.device),)](
        _desc(q, tile.block_m), _desc(k, tile.block_n), _desc(v, tile.block_n), _desc(o, tile.block_m), lse,
        heads, heads // heads_k, batch * heads, seq_q, seq_k, LOG2E / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, CAUSAL=is_causal,
        PERSISTENT=tile.persistent, TILE_MAJOR=tile.tile_major, WARP_SPEC=tile.warp_spec, **_opts(tile),
    )  # fmt: skip
    return o, lse


@functools.cache
def _gluon_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The default shared-memory swizzle of a ``(1, 1, rows, head_dim)`` block (cached: building it costs
    tens of microseconds of host time, several times per call)."""
    from triton.experimental.gluon import language as gl

    gluon_dtype = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], gluon_dtype)


def gluon_descriptor(t: Tensor, rows: int):
    """A Gluon TMA descriptor of ``t (B, H, S, d)`` with ``(1, 1, rows, d)`` blocks in the default swizzle."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    head_dim = t.shape[-1]
    return GluonDescriptor.from_tensor(t, [1, 1, rows, head_dim], _gluon_layout(rows, head_dim, t.dtype))


def window_reason(seq_q: int, seq_k: int, is_causal: bool, window: Window) -> str | None:
    """Why the Gluon kernels cannot take ``window`` (checked by :func:`flashattn.inputs.check_window`) for
    these lengths, or None: they need every query to see a key."""
    if window is not None and seq_k - seq_q + (right := right_bound(is_causal, window)) < 0:
        return f"window {window} leaves the first {seq_q - seq_k - right} queries without keys"
    return None


def _band(q: Tensor, k: Tensor, is_causal: bool, window) -> dict:
    """The Gluon kernels' window arguments (``left``, ``right``, 0 where absent, and ``WINDOW``) for ``q, k
    (B, H, S, d)``; a window that :func:`window_reason` refuses raises ``ValueError``."""
    window = check_window(window)
    if (reason := window_reason(q.shape[2], k.shape[2], is_causal, window)) is not None:
        raise ValueError(reason)
    return {"left": window[0] if window else 0, "right": right_bound(is_causal, window) or 0,
            "WINDOW": window is not None}  # fmt: skip


def gluon_forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window = None
) -> tuple[Tensor, Tensor]:
    """:func:`forward` by the warp-specialised Gluon kernel of :mod:`flashattn.gluon_fwd` (sm90 GPUs only):
    ``o`` ``(B, H, Sq, d)`` and fp32 ``lse`` ``(B, H, Sq)``, natural log. ``window=(left, right)`` as
    :func:`flashattn.flash_attention` takes it, where every query sees a key (:func:`window_reason`)."""
    from flashattn.gluon_fwd import gluon_fwd_kernel

    _check_shapes(q, k, v, is_causal)
    if (reason := device_reason(q.device)) is not None:
        raise ValueError(reason)
    band = _band(q, k, is_causal, window)
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    o = torch.empty_like(q)  # q's layout, e.g. the (B, S, H, d) storage of attention layers
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    t = configs_for(head_dim).gluon
    n_items = triton.cdiv(seq_q, t.consumers * t.block_m) * batch * heads
    programs = _n_programs(n_items, t, q.device)
    claims = torch.zeros(1, dtype=torch.int32, device=q.device) if t.persistent else lse  # lse: not read
    gluon_fwd_kernel[(programs,)](
        gluon_descriptor(q, t.block_m), gluon_descriptor(k, t.block_n), gluon_descriptor(v, t.block_n),
        gluon_descriptor(o, t.block_m), lse, claims, n_items, heads, heads // heads_k, seq_q, seq_k,
        qk_scale=LOG2E / math.sqrt(head_dim), HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        STAGES=t.stages, CAUSAL=is_causal, CONSUMERS=t.consumers, OVERLAP=t.overlap, PINGPONG=t.pingpong,
        PERSISTENT=t.persistent, num_warps=4, maxnreg=t.maxnreg(), **band,
    )  # fmt: skip
    return o, lse


def _check_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool):
    _check_shapes(q, k, v, is_causal)
    if o.shape != q.shape or do.shape != q.shape:
        raise ValueError(f"o {tuple(o.shape)} and do {tuple(do.shape)} must have q's shape {tuple(q.shape)}")
    if lse.shape != q.shape[:-1] or lse.dtype != torch.float32:
        raise ValueError(
            f"lse must be fp32 of shape {tuple(q.shape[:-1])}, got {lse.dtype} {tuple(lse.shape)}"
        )
    _check_device(q)


def _prepared(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    do: Tensor,
    is_causal: bool,
    gpu_only: bool = False,
) -> tuple:
    """Checked, copy-engine-ready inputs of a backward and its outputs, allocated:
    ``(q, k, v, o, lse, do, dq, dk, dv, delta)`` (gradients in the layouts of ``q, k, v``). ``gpu_only``:
    also refuse the interpreter and GPUs other than sm90 (the Gluon kernels)."""
    _check_backward(q, k, v, o, lse, do, is_causal)
    if gpu_only and (reason := device_reason(q.device)) is not None:
        raise ValueError(reason)
    q, k, v, o, do = (_tma_ready(t) for t in (q, k, v, o, do))
    lse = lse.contiguous()
    return q, k, v, o, lse, do, *(torch.empty_like(t) for t in (q, k, v, lse))


def _triton_dq_pass(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, dq: Tensor,
    delta: Tensor,
) -> None:  # fmt: skip
    """``D`` into ``delta`` and ``dQ`` into ``dq`` by the Triton-language :func:`hopper_bwd.dq_kernel`."""
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    t = configs_for(head_dim).dq
    dq_kernel[(triton.cdiv(seq_q, t.block_m) * batch * heads,)](
        _desc(q, t.block_m), _desc(k, t.block_n), _desc(v, t.block_n), _desc(o, t.block_m),
        _desc(do, t.block_m), _desc(dq, t.block_m), lse, delta,
        heads, heads // heads_k, batch * heads, seq_q, seq_k, LOG2E / math.sqrt(head_dim),
        1.0 / math.sqrt(head_dim), HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=is_causal,
        TILE_MAJOR=t.tile_major, WARP_SPEC=t.warp_spec, **_opts(t),
    )  # fmt: skip


def backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """``dq, dk, dv`` (in the layouts of ``q, k, v``) from the forward's ``o`` and ``lse``: seven tile
    products (the dQ kernel recomputes ``Q K^T`` and ``dO V^T``)."""
    q, k, v, o, lse, do, dq, dk, dv, delta = _prepared(q, k, v, o, lse, do, is_causal)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    _triton_dq_pass(q, k, v, o, lse, do, is_causal, dq, delta)
    t = configs_for(head_dim).dkdv
    dkdv_kernel[(triton.cdiv(seq_k, t.block_n) * batch * heads_k,)](
        _desc(q, t.block_m), _desc(k, t.block_n), _desc(v, t.block_n), _desc(do, t.block_m),
        _desc(dk, t.block_n), _desc(dv, t.block_n), lse, delta,
        heads, heads // heads_k, batch * heads_k, seq_q, seq_k, LOG2E / math.sqrt(head_dim),
        1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=is_causal,
        TILE_MAJOR=t.tile_major, WARP_SPEC=t.warp_spec, **_opts(t),
    )  # fmt: skip
    return dq, dk, dv


def gluon_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool,
    window: Window = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`backward` by the Gluon kernels (sm90 GPUs only): :func:`gluon_dq_pass` (``D`` and ``dQ``), then
    :func:`gluon_dkdv_pass`. Seven tile products, as :func:`backward`; ``window`` as :func:`gluon_forward`
    takes it (refused, as there, before the first launch)."""
    q, k, v, o, lse, do, dq, dk, dv, delta = _prepared(q, k, v, o, lse, do, is_causal, gpu_only=True)
    descriptor = functools.cache(gluon_descriptor)  # one per (tensor, rows): the two kernels share most
    gluon_dq_pass(q, k, v, o, lse, do, is_causal, dq, delta, descriptor, window)
    gluon_dkdv_pass(q, k, v, do, lse, delta, is_causal, dk, dv, descriptor, window)
    return dq, dk, dv


def gluon_dq_pass(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, dq: Tensor,
    delta: Tensor, descriptor=gluon_descriptor, window: Window = None,
) -> None:  # fmt: skip
    """Write ``D = rowsum(O dO)`` (fp32 ``(B, H, Sq)``) into ``delta`` and ``dQ`` into ``dq``: the Gluon
    kernel of :mod:`flashattn.gluon_dq`, or the Triton-language one when the tile table's ``gluon_dq`` is
    None. Inputs as :func:`gluon_backward` passes them (checked, copy-engine ready); ``descriptor(t, rows)``
    makes the TMA descriptors; ``window`` needs the Gluon kernel."""
    from flashattn.gluon_dq import gluon_dq_kernel

    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    qk_scale, sm_scale = LOG2E / math.sqrt(head_dim), 1.0 / math.sqrt(head_dim)
    if (t := configs_for(head_dim).gluon_dq) is not None:
        desc_q, desc_o, desc_do, desc_dq = (descriptor(x, t.block_m) for x in (q, o, do, dq))
        desc_k, desc_v = (descriptor(x, t.block_n) for x in (k, v))
        gluon_dq_kernel[(triton.cdiv(seq_q, 2 * t.block_m) * batch * heads,)](
            desc_q, desc_k, desc_v, desc_o, desc_do, desc_dq, lse, delta, heads, heads // heads_k, seq_q,
            seq_k, qk_scale=qk_scale, sm_scale=sm_scale, HEAD_DIM=head_dim, BLOCK_M=t.block_m,
            BLOCK_N=t.block_n, STAGES=t.stages, CAUSAL=is_causal, OVERLAP=t.overlap, num_warps=4,
            maxnreg=GluonTile(consumers=2).maxnreg(), **_band(q, k, is_causal, window),
        )  # fmt: skip
    elif window is not None:
        raise ValueError(f"window {window} needs the Gluon dQ kernel, which d {head_dim}'s tiles lack")
    else:
        _triton_dq_pass(q, k, v, o, lse, do, is_causal, dq, delta)


def gluon_dkdv_pass(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, is_causal: bool, dk: Tensor,
    dv: Tensor, descriptor=gluon_descriptor, window: Window = None,
) -> None:  # fmt: skip
    """Write ``dK, dV`` into ``dk, dv`` by the Gluon kernel of :mod:`flashattn.gluon_bwd`, from the ``D``
    that :func:`gluon_dq_pass` wrote; ``descriptor`` and ``window`` as there."""
    from flashattn.gluon_bwd import gluon_dkdv_kernel

    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    g = configs_for(head_dim).gluon_dkdv
    gluon_dkdv_kernel[(triton.cdiv(seq_k, 2 * g.block_n) * batch * heads_k,)](
        descriptor(q, g.block_m), descriptor(k, g.block_n), descriptor(v, g.block_n),
        descriptor(do, g.block_m), descriptor(dk, g.block_n), descriptor(dv, g.block_n),
        lse, delta, heads, heads // heads_k, seq_q, seq_k, qk_scale=LOG2E / math.sqrt(head_dim),
        sm_scale=1.0 / math.sqrt(head_dim), HEAD_DIM=head_dim, BLOCK=g.block_n, BLOCK_M=g.block_m,
        STAGES=g.stages, CAUSAL=is_causal, OVERLAP=g.overlap,
        TILE_MAJOR=g.gqa_tile_major and is_causal and heads_k < heads, num_warps=4,
        maxnreg=GluonTile(consumers=2).maxnreg(), **_band(q, k, is_causal, window),
    )  # fmt: skip


def dq_accumulator(q: Tensor, rows: int) -> tuple[Tensor, object]:
    """A zeroed fp32 dQ accumulator of ``q (B, H, Sq, d)``, rows padded to whole ``rows``-row tiles, and its
    Gluon TMA descriptor with ``(1, 1, rows, d / 2)`` blocks (one consumer warpgroup's half) in the staging
    swizzle of :mod:`flashattn.gluon_bwd5`."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from flashattn.gluon_bwd5 import STAGING_LAYOUT

    batch, heads, seq_q, head_dim = q.shape
    acc = torch.zeros((batch, heads, triton.cdiv(seq_q, rows) * rows, head_dim), dtype=torch.float32,
                      device=q.device)  # fmt: skip
    return acc, GluonDescriptor.from_tensor(acc, [1, 1, rows, head_dim // 2], STAGING_LAYOUT.value)


def gluon_backward5(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`backward` in five tile products by the Gluon kernel of :mod:`flashattn.gluon_bwd5` (sm90 GPUs
    only): ``D`` and zeroed turns (:func:`flashattn.hopper_bwd5.delta_kernel`), then one program per
    (``2 * block_n`` keys, batch, K/V head) for ``dK, dV`` and the ``dQ`` parts, added in a fixed order into
    an fp32 accumulator that is then scaled into ``dq``."""
    from flashattn.gluon_bwd5 import gluon_dkdvdq_kernel

    q, k, v, o, lse, do, dq, dk, dv, delta = _prepared(q, k, v, o, lse, do, is_causal, gpu_only=True)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    g = configs_for(head_dim).gluon_dkdvdq
    n_m_tiles = triton.cdiv(seq_q, g.block_m)
    turns = torch.empty((batch * heads, n_m_tiles * TURN_STRIDE.value), dtype=torch.int32, device=q.device)
    delta_kernel[(n_m_tiles, batch * heads)](
        _desc(o, g.block_m), _desc(do, g.block_m), delta, turns, heads, seq_q, n_m_tiles,
        HEAD_DIM=head_dim, BLOCK_M=g.block_m, num_warps=4,
    )  # fmt: skip
    acc, desc_acc = dq_accumulator(q, g.block_m)
    descriptor = functools.cache(gluon_descriptor)
    sm_scale = 1.0 / math.sqrt(head_dim)
    gluon_dkdvdq_kernel[(triton.cdiv(seq_k, 2 * g.block_n) * batch * heads_k,)](
        descriptor(q, g.block_m), descriptor(k, g.block_n), descriptor(v, g.block_n),
        descriptor(do, g.block_m), descriptor(dk, g.block_n), descriptor(dv, g.block_n), desc_acc,
        lse, delta, turns, heads, heads // heads_k, seq_q, seq_k, LOG2E * sm_scale, sm_scale,
        HEAD_DIM=head_dim, BLOCK=g.block_n, BLOCK_M=g.block_m, STAGES=g.stages, CAUSAL=is_causal,
        EARLY_DQ=g.early_dq, DEFER_STAGE=g.defer_stage, num_warps=4, maxnreg=GluonTile(consumers=2).maxnreg(),
    )  # fmt: skip
    torch.mul(acc[:, :, :seq_q], sm_scale, out=dq)
    return dq, dk, dv


def backward5(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`backward` in five tile products (:mod:`flashattn.hopper_bwd5`): the dK/dV programs also add
    ``dS K`` into an fp32 dQ accumulator, one key tile at a time in a fixed order (bitwise repeatable)."""
    q, k, v, o, lse, do, dq, dk, dv, delta = _prepared(q, k, v, o, lse, do, is_causal)
    (batch, heads, seq_q, head_dim), heads_k, seq_k = q.shape, k.shape[1], k.shape[2]
    t = configs_for(head_dim).dkdvdq
    n_m_tiles = triton.cdiv(seq_q, t.block_m)
    turns = torch.empty((batch * heads, n_m_tiles * TURN_STRIDE.value), dtype=torch.int32, device=q.device)
    acc_shape = (batch * heads, n_m_tiles * t.block_m, head_dim)  # fp32 dQ, rows padded to whole tiles
    dq_acc = torch.empty(acc_shape, dtype=torch.float32, device=q.device)
    delta_kernel[(n_m_tiles, batch * heads)](
        _desc(o, t.block_m), _desc(do, t.block_m), delta, turns, heads, seq_q, n_m_tiles,
        HEAD_DIM=head_dim, BLOCK_M=t.block_m, num_warps=4,
    )  # fmt: skip
    dkdvdq_kernel[(triton.cdiv(seq_k, t.block_n) * batch * heads_k,)](
        _desc(q, t.block_m), _desc(k, t.block_n), _desc(v, t.block_n), _desc(do, t.block_m),
        _desc(dk, t.block_n), _desc(dv, t.block_n), dq, *dq.stride()[:3], lse, delta, dq_acc, turns,
        heads, heads // heads_k, seq_q, seq_k, LOG2E / math.sqrt(head_dim), 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=t.block_m, BLOCK_N=t.block_n, CAUSAL=is_causal,
        INTERPRET=triton.knobs.runtime.interpret, **_opts(t),
    )  # fmt: skip
    return dq, dk, dv
