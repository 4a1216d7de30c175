"""FlashAttention-2 forward and backward in Triton.

Limits, so that nobody learns them from a crash:
- head dims 16, 32, 64, 128 (others are refused); fp16, bf16 and fp32 (fp32 dots run as tf32x3: three TF32
  tensor-core products of split operands, about fp32's accuracy; plain TF32 would lose 13 mantissa bits);
- any lengths >= 1 (tails are masked loads and stores), any leading dims ``(..., seq, d)``, any strides (the
  kernels read the strides of a ``(batch, heads, seq, d)`` view; only merging leading dims may copy);
- ``seq_q != seq_k`` is fine; causal masking is bottom-right aligned (query ``i`` sees key
  ``j <= i + seq_k - seq_q``) and needs ``seq_q <= seq_k``;
- deterministic: no atomics; every output element is written by exactly one program;
- CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1`` (slow, for tests);
- tile shapes come from a short table per head dim and dtype (:func:`configs_for`), measured with
  ``python -m flashattn.tune``; tests pin them with :func:`pinned_configs`.

Layout of the file: the forward inner loop and kernel, the backward kernels (``D = rowsum(O * dO)``;
``dK, dV`` looping over query tiles; ``dQ`` looping over key tiles), the launchers, the ``autograd.Function``.
Lengths and head counts are not specialised on (``do_not_specialize``), so one compiled kernel per
(head dim, dtype, causal, tile shape) serves every length. Scores are kept in base-2 units: ``log2(e) /
sqrt(d)`` is folded into one scale so the softmax uses ``exp2``.
"""

import contextlib
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from flashattn.inputs import as_4d, check_qkv
from flashattn.interpret import check_interpreted

LOG2E = math.log2(math.e)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _tile_and_head(n_tiles, n_heads):
    """This program's tile index along the sequence, its flat batch-head, and its (batch, head)."""
    pid = tl.program_id(0)
    bh = pid // n_tiles
    return pid % n_tiles, bh, (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)


@triton.jit
def _fwd_inner(
    acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
    offs_m, offs_d, start, end, seq_k, causal_shift, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Key tiles ``[start, end)`` of one query tile; ``MASKED`` tiles apply the length and causal masks."""
    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd
        if MASKED:  # noqa: SIM108 (Triton resolves constexpr branches at compile time)
            k = tl.load(k_ptrs, mask=offs_n[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        probs = tl.math.exp2(scores * qk_scale - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        if MASKED:  # noqa: SIM108
            v = tl.load(v_ptrs, mask=offs_n[:, None] < seq_k, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit(do_not_specialize=["n_heads", "seq_q", "seq_k"])
def _fwd_kernel(
    Q, K, V, OUT, LSE,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    n_heads, seq_q, seq_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch-head); heaviest causal tiles of each head are launched first."""
    n_tiles = tl.cdiv(seq_q, BLOCK_M)
    tile, bh, b, h = _tile_and_head(n_tiles, n_heads)
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < seq_q, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_shift = seq_k - seq_q
    if CAUSAL:  # keys up to the tile's last query; tiles wholly left of its first query need no mask
        end = tl.minimum(seq_k, start_m + BLOCK_M + causal_shift)
        full_end = tl.minimum((start_m + causal_shift + 1) // BLOCK_N, seq_k // BLOCK_N) * BLOCK_N
    else:
        end = seq_k
        full_end = seq_k // BLOCK_N * BLOCK_N
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, 0, full_end, seq_k, causal_shift, qk_scale, BLOCK_N, False, CAUSAL, PRECISION,
    )  # fmt: skip
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_end, end, seq_k, causal_shift, qk_scale, BLOCK_N, True, CAUSAL, PRECISION,
    )  # fmt: skip

    o = acc / row_sum[:, None]
    o_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=offs_m[:, None] < seq_q)
    lse = (row_max + tl.math.log2(row_sum)) / 1.4426950408889634  # base 2 -> natural log
    tl.store(LSE + bh.to(tl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)


@triton.jit(do_not_specialize=["n_heads", "seq_q"])
def _bwd_delta_kernel(
    OUT, DO, DELTA,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_gb, stride_gh, stride_gs, stride_gd,
    n_heads, seq_q,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """``D = rowsum(O * dO)`` in fp32, shape ``(batch * heads, seq_q)``."""
    tile, bh, b, h = _tile_and_head(tl.cdiv(seq_q, BLOCK_M), n_heads)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < seq_q
    o_ptrs = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od
    o = tl.load(o_ptrs, mask=rows, other=0.0)
    do_ptrs = DO + b * stride_gb + h * stride_gh + offs_m[:, None] * stride_gs + offs_d[None, :] * stride_gd
    do = tl.load(do_ptrs, mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base,
    stride_qs, stride_qd, stride_gs, stride_gd,
    offs_n, offs_d, start, end, seq_q, causal_shift, qk_scale,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Query tiles ``[start, end)`` against one key tile, in transposed form (rows are keys)."""
    for start_m in tl.range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = q_base + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd
        do_ptrs = do_base + offs_m[:, None] * stride_gs + offs_d[None, :] * stride_gd
        if MASKED:
            q = tl.load(q_ptrs, mask=offs_m[:, None] < seq_q, other=0.0)
            lse = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=0.0)
        else:
            q = tl.load(q_ptrs)
            lse = tl.load(lse_base + offs_m)
        scores_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse[None, :] * 1.4426950408889634)
        if MASKED:
            visible = offs_m[None, :] < seq_q
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
            probs_t = tl.where(visible, probs_t, 0.0)
            do = tl.load(do_ptrs, mask=offs_m[:, None] < seq_q, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
        else:
            do = tl.load(do_ptrs)
            delta = tl.load(delta_base + offs_m)
        dv = tl.dot(probs_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dprobs_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dscores_t = probs_t * (dprobs_t - delta[None, :])
        dk = tl.dot(dscores_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["n_heads", "seq_q", "seq_k"])
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_gb, stride_gh, stride_gs, stride_gd,
    stride_dkb, stride_dkh, stride_dks, stride_dkd,
    stride_dvb, stride_dvh, stride_dvs, stride_dvd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (key tile, batch-head): ``dK, dV`` of ``BLOCK_N`` keys, looping over query tiles."""
    tile, bh, b, h = _tile_and_head(tl.cdiv(seq_k, BLOCK_N), n_heads)
    start_n = tile * BLOCK_N  # causal: early keys see the most queries, so they go first
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < seq_k
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd,
                mask=keys, other=0.0)  # fmt: skip
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                mask=keys, other=0.0)  # fmt: skip
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_gb + h * stride_gh
    lse_base = LSE + bh.to(tl.int64) * seq_q
    delta_base = DELTA + bh.to(tl.int64) * seq_q

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    causal_shift = seq_k - seq_q
    padded_q = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    full_q = seq_q // BLOCK_M * BLOCK_M
    if (
        CAUSAL
    ):  # query i sees key j iff i >= j - shift: skip earlier query tiles, mask those crossing the diagonal
        start = tl.maximum(start_n - causal_shift, 0) // BLOCK_M * BLOCK_M
        diag_end = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_shift, 0), BLOCK_M) * BLOCK_M,
                              padded_q)  # fmt: skip
    else:
        start = 0
        diag_end = 0
    dk, dv = _bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs, stride_gd,
        offs_n, offs_d, start, diag_end, seq_q, causal_shift, qk_scale, BLOCK_M, True, CAUSAL, PRECISION,
    )  # fmt: skip
    dk, dv = _bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs, stride_gd,
        offs_n, offs_d, diag_end, full_q, seq_q, causal_shift, qk_scale, BLOCK_M, False, CAUSAL, PRECISION,
    )  # fmt: skip
    dk, dv = _bwd_dkdv_inner(
        dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs, stride_gd,
        offs_n, offs_d, tl.maximum(diag_end, full_q), seq_q, seq_q, causal_shift, qk_scale,
        BLOCK_M, True, CAUSAL, PRECISION,
    )  # fmt: skip

    dk_ptrs = (
        DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :] * stride_dkd
    )
    dv_ptrs = (
        DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :] * stride_dvd
    )
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=keys)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=keys)


@triton.jit
def _bwd_dq_inner(
    dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
    offs_m, offs_d, start, end, seq_k, causal_shift, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Key tiles ``[start, end)`` against one query tile."""
    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd
        v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd
        if MASKED:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < seq_k, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < seq_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        probs = tl.math.exp2(scores * qk_scale - lse[:, None])
        if MASKED:
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            probs = tl.where(visible, probs, 0.0)
        dprobs = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        dscores = probs * (dprobs - delta[:, None])
        dq = tl.dot(dscores.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=["n_heads", "seq_q", "seq_k"])
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_gb, stride_gh, stride_gs, stride_gd,
    stride_dqb, stride_dqh, stride_dqs, stride_dqd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch-head): ``dQ`` of ``BLOCK_M`` queries, looping over key tiles."""
    n_tiles = tl.cdiv(seq_q, BLOCK_M)
    tile, bh, b, h = _tile_and_head(n_tiles, n_heads)
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < seq_q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
                mask=rows, other=0.0)  # fmt: skip
    do_ptrs = DO + b * stride_gb + h * stride_gh + offs_m[:, None] * stride_gs + offs_d[None, :] * stride_gd
    do = tl.load(do_ptrs, mask=rows, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * seq_q + offs_m, mask=offs_m < seq_q, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_shift = seq_k - seq_q
    if CAUSAL:
        end = tl.minimum(seq_k, start_m + BLOCK_M + causal_shift)
        full_end = tl.minimum((start_m + causal_shift + 1) // BLOCK_N, seq_k // BLOCK_N) * BLOCK_N
    else:
        end = seq_k
        full_end = seq_k // BLOCK_N * BLOCK_N
    dq = _bwd_dq_inner(
        dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, 0, full_end, seq_k, causal_shift, qk_scale, BLOCK_N, False, CAUSAL, PRECISION,
    )  # fmt: skip
    dq = _bwd_dq_inner(
        dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_end, end, seq_k, causal_shift, qk_scale, BLOCK_N, True, CAUSAL, PRECISION,
    )  # fmt: skip
    dq_ptrs = (
        DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :] * stride_dqd
    )
    tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows)


class TileConfig(NamedTuple):
    """Launch shape of one kernel: ``block_m`` query and ``block_n`` key positions per tile.

    ``fp32_dot`` is how fp32 inputs multiply: ``"ieee"`` (exact fp32 products on the FMA units) or
    ``"tf32x3"`` (each operand split into two TF32 parts, three tensor-core products: about fp32's
    accuracy). 16-bit inputs ignore it.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    fp32_dot: str = "ieee"


class KernelConfigs(NamedTuple):
    """One :class:`TileConfig` per kernel; ``dkdv`` programs own ``block_n`` keys, the others ``block_m``."""

    forward: TileConfig
    dkdv: TileConfig
    dq: TileConfig


# Keyed by (head_dim, 16-bit?). The (128, 16-bit) entry won every candidate list of `python -m flashattn.tune`
# on an H200 at (1, 32, 16384, 128) (docs/flashattn.md); the others follow the same reasoning, untimed:
# 128-query forward tiles keep the tensor cores busy; a 128-wide fp32 accumulator needs 8 warps of registers.
# fp32 multiplies with tf32x3 (three tensor-core products): the fp32 entries for d 128 and 64 won
# `flashattn.tune --dtype fp32 --seq 4096` on an H200, 3-40x faster than the best IEEE (FMA) tiles; fp32
# tiles take twice the shared memory, so d 128 fits only narrow ones. d 32 and 16 reuse d 64's, untimed.
X3 = "tf32x3"
_CONFIGS: dict[tuple[int, bool], KernelConfigs] = {
    (128, True): KernelConfigs(
        TileConfig(128, 64, 8, 3), TileConfig(64, 128, 8, 3), TileConfig(128, 64, 8, 3)
    ),
    (64, True): KernelConfigs(
        TileConfig(128, 64, 4, 3), TileConfig(64, 128, 8, 3), TileConfig(128, 64, 8, 3)
    ),
    (32, True): KernelConfigs(TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3), TileConfig(64, 64, 4, 3)),
    (16, True): KernelConfigs(TileConfig(128, 64, 4, 3), TileConfig(64, 64, 4, 3), TileConfig(64, 64, 4, 3)),
    (128, False): KernelConfigs(
        TileConfig(128, 32, 8, 2, X3), TileConfig(32, 32, 4, 2, X3), TileConfig(64, 32, 4, 2, X3)
    ),
    (64, False): KernelConfigs(
        TileConfig(128, 64, 8, 2, X3), TileConfig(32, 128, 8, 2, X3), TileConfig(128, 32, 8, 2, X3)
    ),
    (32, False): KernelConfigs(
        TileConfig(128, 64, 8, 2, X3), TileConfig(32, 128, 8, 2, X3), TileConfig(128, 32, 8, 2, X3)
    ),
    (16, False): KernelConfigs(
        TileConfig(128, 64, 8, 2, X3), TileConfig(32, 128, 8, 2, X3), TileConfig(128, 32, 8, 2, X3)
    ),
}
_pinned: KernelConfigs | None = None


def configs_for(head_dim: int, dtype: torch.dtype) -> KernelConfigs:
    """The tile table's entry for ``head_dim`` and ``dtype``, or the one pinned by :func:`pinned_configs`."""
    if _pinned is not None:
        return _pinned
    return _CONFIGS[(head_dim, dtype != torch.float32)]


@contextlib.contextmanager
def pinned_configs(configs: KernelConfigs) -> Iterator[None]:
    """Use ``configs`` for every launch inside the ``with`` block (tests pin one, to be reproducible)."""
    global _pinned
    previous, _pinned = _pinned, configs
    try:
        yield
    finally:
        _pinned = previous


def _precision(dtype: torch.dtype, cfg: TileConfig) -> str:
    return cfg.fp32_dot if dtype == torch.float32 else "tf32"  # the second is ignored for 16-bit operands


def launch_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, cfg: TileConfig) -> tuple[Tensor, Tensor]:
    """Forward on 4-D views ``(B, H, S, d)``: ``o`` (q's dtype and layout), fp32 ``lse`` ``(B, H, seq_q)``."""
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq_q, cfg.block_m) * batch * heads,)
    _fwd_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads, seq_q, seq_k, LOG2E / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        PRECISION=_precision(q.dtype, cfg), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o, lse


def launch_delta(o: Tensor, do: Tensor, block_m: int = 64) -> Tensor:
    """``D = rowsum(O * dO)`` of 4-D views, fp32 ``(B, H, seq_q)``."""
    batch, heads, seq_q, head_dim = o.shape
    delta = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(seq_q, block_m) * batch * heads,)
    _bwd_delta_kernel[grid](
        o, do, delta, *o.stride(), *do.stride(), heads, seq_q, HEAD_DIM=head_dim, BLOCK_M=block_m, num_warps=4
    )
    return delta


def launch_dkdv(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, causal: bool, cfg: TileConfig
) -> tuple[Tensor, Tensor]:
    """``dK, dV`` on 4-D views (k's and v's dtype and layout)."""
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid = (triton.cdiv(seq_k, cfg.block_n) * batch * heads,)
    _bwd_dkdv_kernel[grid](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        heads, seq_q, seq_k, LOG2E / math.sqrt(head_dim), 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        PRECISION=_precision(q.dtype, cfg), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dk, dv


def launch_dq(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, causal: bool, cfg: TileConfig
) -> Tensor:
    """``dQ`` on 4-D views (q's dtype and layout)."""
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    dq = torch.empty_like(q)
    grid = (triton.cdiv(seq_q, cfg.block_m) * batch * heads,)
    _bwd_dq_kernel[grid](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        heads, seq_q, seq_k, LOG2E / math.sqrt(head_dim), 1.0 / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        PRECISION=_precision(q.dtype, cfg), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return dq


def _check_device(q: Tensor) -> None:
    interpreted = triton.knobs.runtime.interpret
    if q.device.type != "cuda" and not interpreted:
        raise ValueError(
            f"q is on {q.device}; FlashAttention2Triton needs CUDA tensors (or TRITON_INTERPRET=1)"
        )


class FlashAttention2Triton(torch.autograd.Function):
    """``FlashAttention2Triton.apply(q, k, v, is_causal=False) -> o`` on ``(..., seq, d)`` tensors.

    Saves ``L`` ``(..., seq_q)`` fp32 (the only new tensor) and ``q, k, v, o`` for the backward recomputation.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        check_qkv(q, k, v, is_causal, _DTYPES)
        _check_device(q)
        check_interpreted(q)
        configs = configs_for(q.shape[-1], q.dtype)
        o, lse = launch_forward(as_4d(q), as_4d(k), as_4d(v), is_causal, configs.forward)
        o = o.reshape(q.shape)
        lse = lse.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        ctx.configs = configs
        return o

    @staticmethod
    def backward(ctx, do: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        lse, q, k, v, o = ctx.saved_tensors
        q4, k4, v4, do4 = as_4d(q), as_4d(k), as_4d(v), as_4d(do)
        lse4 = lse.reshape(q4.shape[:-1])
        delta = launch_delta(as_4d(o), do4)
        dk, dv = launch_dkdv(q4, k4, v4, do4, lse4, delta, ctx.is_causal, ctx.configs.dkdv)
        dq = launch_dq(q4, k4, v4, do4, lse4, delta, ctx.is_causal, ctx.configs.dq)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None
