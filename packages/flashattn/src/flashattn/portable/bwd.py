"""Triton backward kernels of FlashAttention-2: ``D = rowsum(O * dO)``, then ``dK, dV`` and ``dQ``.

Both gradient kernels recompute the probabilities from ``Q, K`` and the saved ``lse``. ``dK, dV`` of one key
tile of key/value head ``hk`` sum over the query heads ``hk * group ... hk * group + group - 1`` in a fixed
order inside one program, so grouped-query attention needs no atomics and repeats bit for bit. The same
kernel can compute only one of them (``WANT_DK`` / ``WANT_DV``): at head dim 256 the two ``(BLOCK_N, 256)``
fp32 accumulators crowd the registers beside the recomputed probabilities, so dV (2 products a tile) and dK
(3 products) can run as two programs of one accumulator each. Tile layout, strides and visibility are those of
:mod:`flashattn.portable.fwd`.
"""

import triton
import triton.language as tl

from flashattn.portable.fwd import (
    LOG2E,
    LSE_STRIDES,
    column_ranges,
    load_tile,
    program_ids,
    spans,
    store_tile,
    visible,
)


@triton.jit(do_not_specialize=["q_heads", "seq_q", "head_dim", *LSE_STRIDES])
def delta_kernel(
    OUT, DO, DELTA, CU_Q,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_gb, stride_gh, stride_gs, stride_gd,
    stride_lb, stride_lh,
    q_heads, seq_q, head_dim,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    """``D = rowsum(O * dO)`` in fp32, laid out like ``lse``."""
    tile, b, h = program_ids(tl.cdiv(seq_q, BLOCK_M), q_heads)
    q_start, seq_q, _, _ = spans(CU_Q, CU_Q, b, seq_q, seq_q, VARLEN)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    if tile * BLOCK_M >= seq_q:
        return
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = OUT + b * stride_ob + h * stride_oh + q_start * stride_os
    do_base = DO + b * stride_gb + h * stride_gh + q_start * stride_gs
    o = load_tile(o_base, offs_m, offs_d, stride_os, stride_od, seq_q, head_dim, True, EVEN_D)
    do = load_tile(do_base, offs_m, offs_d, stride_gs, stride_gd, seq_q, head_dim, True, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + b * stride_lb + h * stride_lh + q_start + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _dkdv_inner(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base,
    stride_qs, stride_qd, stride_gs, stride_gd,
    offs_n, offs_d, start, end, seq_q, head_dim, lo_off, hi_off, qk_scale,
    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
    EVEN_D: tl.constexpr, PRECISION: tl.constexpr, WANT_DK: tl.constexpr, WANT_DV: tl.constexpr,
):  # fmt: skip
    """Query tiles ``[start, end)`` of one query head against one key tile, transposed (rows are keys);
    updates ``dk`` if ``WANT_DK`` and ``dv`` if ``WANT_DV`` (the other passes through untouched)."""
    for start_m in tl.range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_base, offs_m, offs_d, stride_qs, stride_qd, seq_q, head_dim, MASKED, EVEN_D)
        do = load_tile(do_base, offs_m, offs_d, stride_gs, stride_gd, seq_q, head_dim, MASKED, EVEN_D)
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
        scores_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        probs_t = tl.math.exp2(scores_t * qk_scale - lse[None, :] * LOG2E)
        if MASKED:
            probs_t = tl.where(visible(offs_n, offs_m, seq_q, lo_off, hi_off, HAS_LO, HAS_HI), probs_t, 0.0)
        if WANT_DV:
            dv = tl.dot(probs_t.to(do.dtype), do, dv, input_precision=PRECISION)
        if WANT_DK:
            if MASKED:
                delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
            else:
                delta = tl.load(delta_base + offs_m)
            dprobs_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dscores_t = probs_t * (dprobs_t - delta[None, :])
            dk = tl.dot(dscores_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(
    do_not_specialize=["kv_heads", "group", "seq_q", "seq_k", "head_dim", "left", "right", *LSE_STRIDES]
)
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_gb, stride_gh, stride_gs, stride_gd,
    stride_dkb, stride_dkh, stride_dks, stride_dkd,
    stride_dvb, stride_dvh, stride_dvs, stride_dvd,
    stride_lb, stride_lh,
    kv_heads, group, seq_q, seq_k, head_dim, left, right, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr, WANT_DK: tl.constexpr, WANT_DV: tl.constexpr,
):  # fmt: skip
    """One program per (key tile, batch, key/value head): ``dK`` (if ``WANT_DK``) and ``dV`` (if
    ``WANT_DV``) of ``BLOCK_N`` keys; a dV-only program never reads ``V`` or ``D``."""
    tile, b, hk = program_ids(tl.cdiv(seq_k, BLOCK_N), kv_heads)
    q_start, seq_q, k_start, seq_k = spans(CU_Q, CU_K, b, seq_q, seq_k, VARLEN)
    start_n = tile * BLOCK_N  # causal: early keys see the most queries, and they go first
    if start_n >= seq_k:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_base = K + b * stride_kb + hk * stride_kh + k_start * stride_ks
    v_base = V + b * stride_vb + hk * stride_vh + k_start * stride_vs
    k = load_tile(k_base, offs_n, offs_d, stride_ks, stride_kd, seq_k, head_dim, True, EVEN_D)
    v = load_tile(v_base, offs_n, offs_d, stride_vs, stride_vd, seq_k, head_dim, True, EVEN_D)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    shift = seq_k - seq_q
    lo_off = -shift - right  # query - key: the right bound of keys is the lower bound of queries
    hi_off = -shift + left
    start, full_start, full_end, end = column_ranges(
        start_n, seq_q, lo_off, hi_off, BLOCK_N, BLOCK_M, HAS_RIGHT, HAS_LEFT
    )
    for g in range(group):  # the group's query heads, in order
        h = hk * group + g
        q_base = Q + b * stride_qb + h * stride_qh + q_start * stride_qs
        do_base = DO + b * stride_gb + h * stride_gh + q_start * stride_gs
        lse_base = LSE + b * stride_lb + h * stride_lh + q_start
        delta_base = DELTA + b * stride_lb + h * stride_lh + q_start
        if HAS_RIGHT:
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs,
                stride_gd, offs_n, offs_d, start, full_start, seq_q, head_dim, lo_off, hi_off, qk_scale,
                BLOCK_M, True, HAS_RIGHT, HAS_LEFT, EVEN_D, PRECISION, WANT_DK, WANT_DV,
            )  # fmt: skip
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs, stride_gd,
            offs_n, offs_d, full_start, full_end, seq_q, head_dim, lo_off, hi_off, qk_scale,
            BLOCK_M, False, HAS_RIGHT, HAS_LEFT, EVEN_D, PRECISION, WANT_DK, WANT_DV,
        )  # fmt: skip
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_qd, stride_gs, stride_gd,
            offs_n, offs_d, full_end, end, seq_q, head_dim, lo_off, hi_off, qk_scale,
            BLOCK_M, True, HAS_RIGHT, HAS_LEFT, EVEN_D, PRECISION, WANT_DK, WANT_DV,
        )  # fmt: skip

    dk_base = DK + b * stride_dkb + hk * stride_dkh + k_start * stride_dks
    dv_base = DV + b * stride_dvb + hk * stride_dvh + k_start * stride_dvs
    if WANT_DK:
        store_tile(dk_base, dk * sm_scale, offs_n, offs_d, stride_dks, stride_dkd, seq_k, head_dim)
    if WANT_DV:
        store_tile(dv_base, dv, offs_n, offs_d, stride_dvs, stride_dvd, seq_k, head_dim)


@triton.jit
def _dq_inner(
    dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
    offs_m, offs_d, start, end, seq_k, head_dim, lo_off, hi_off, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
    EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Key tiles ``[start, end)`` against one query tile."""
    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_ks, stride_kd, seq_k, head_dim, MASKED, EVEN_D)
        v = load_tile(v_base, offs_n, offs_d, stride_vs, stride_vd, seq_k, head_dim, MASKED, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        probs = tl.math.exp2(scores * qk_scale - lse[:, None])
        if MASKED:
            probs = tl.where(visible(offs_m, offs_n, seq_k, lo_off, hi_off, HAS_LO, HAS_HI), probs, 0.0)
        dprobs = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        dscores = probs * (dprobs - delta[:, None])
        dq = tl.dot(dscores.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit(
    do_not_specialize=["q_heads", "group", "seq_q", "seq_k", "head_dim", "left", "right", *LSE_STRIDES]
)
def dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_gb, stride_gh, stride_gs, stride_gd,
    stride_dqb, stride_dqh, stride_dqs, stride_dqd,
    stride_lb, stride_lh,
    q_heads, group, seq_q, seq_k, head_dim, left, right, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch, query head): ``dQ`` of ``BLOCK_M`` queries."""
    n_tiles = tl.cdiv(seq_q, BLOCK_M)
    tile, b, h = program_ids(n_tiles, q_heads)
    q_start, seq_q, k_start, seq_k = spans(CU_Q, CU_K, b, seq_q, seq_k, VARLEN)
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    if start_m >= seq_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + b * stride_qb + h * stride_qh + q_start * stride_qs
    do_base = DO + b * stride_gb + h * stride_gh + q_start * stride_gs
    q = load_tile(q_base, offs_m, offs_d, stride_qs, stride_qd, seq_q, head_dim, True, EVEN_D)
    do = load_tile(do_base, offs_m, offs_d, stride_gs, stride_gd, seq_q, head_dim, True, EVEN_D)
    rows = offs_m < seq_q
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + q_start + offs_m, mask=rows, other=0.0) * LOG2E
    delta = tl.load(DELTA + b * stride_lb + h * stride_lh + q_start + offs_m, mask=rows, other=0.0)
    k_base = K + b * stride_kb + (h // group) * stride_kh + k_start * stride_ks
    v_base = V + b * stride_vb + (h // group) * stride_vh + k_start * stride_vs

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    shift = seq_k - seq_q
    lo_off = shift - left
    hi_off = shift + right
    start, full_start, full_end, end = column_ranges(
        start_m, seq_k, lo_off, hi_off, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:
        dq = _dq_inner(
            dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
            offs_m, offs_d, start, full_start, seq_k, head_dim, lo_off, hi_off, qk_scale,
            BLOCK_N, True, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
        )  # fmt: skip
    dq = _dq_inner(
        dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_start, full_end, seq_k, head_dim, lo_off, hi_off, qk_scale,
        BLOCK_N, False, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
    )  # fmt: skip
    dq = _dq_inner(
        dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_end, end, seq_k, head_dim, lo_off, hi_off, qk_scale,
        BLOCK_N, True, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
    )  # fmt: skip
    dq_base = DQ + b * stride_dqb + h * stride_dqh + q_start * stride_dqs
    store_tile(dq_base, dq * sm_scale, offs_m, offs_d, stride_dqs, stride_dqd, seq_q, head_dim)
