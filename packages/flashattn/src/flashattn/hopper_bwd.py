"""Hopper (sm90) attention backward: two deterministic kernels on TMA tensor descriptors, no atomics.

1. :func:`dq_kernel`, one program per (query tile, batch, query head): first
   ``D = rowsum(O * dO)`` of its rows (fused: the program loads ``dO`` anyway, so ``D`` costs one extra
   read of ``O`` and no launch), written out for the second kernel, then ``dQ`` over the visible key tiles.
2. :func:`dkdv_kernel`, one program per (key tile, batch, K/V head): ``dK, dV`` summed over every query tile
   of every query head of its GQA group, in a fixed order in registers, so repeat runs are bitwise equal.

Causal tiles with no visible pair are skipped; only tiles crossing the diagonal or a sequence's end are
masked. ``LSE`` comes in natural-log units ``(batch * heads_q, seq_q)``; scores are kept in base-2 units.
"""

import triton
import triton.language as tl

from flashattn.hopper_fwd import work_item

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dq_keys(
    dq, q, do, lse2, delta, desc_k, desc_v, b, hk, offs_m, start, end, seq_k, causal_shift, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """Key tiles ``[start, end)`` against one query tile."""
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPEC):
        k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        probs = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse2[:, None])
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            probs = tl.where(visible, probs, 0.0)
        dscores = probs * (tl.dot(do, v.T) - delta[:, None])
        dq = tl.dot(dscores.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize=["n_heads", "group", "n_bh", "seq_q", "seq_k"])
def dq_kernel(
    desc_q, desc_k, desc_v, desc_o, desc_do, desc_dq, LSE, DELTA,
    n_heads, group, n_bh, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TILE_MAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """``D`` and ``dQ`` of ``BLOCK_M`` queries of one head; the heaviest causal tiles go first."""
    n_tiles = tl.cdiv(seq_q, BLOCK_M)
    tile, bh = work_item(tl.program_id(0), n_tiles, n_bh, TILE_MAJOR)
    b, h = bh // n_heads, bh % n_heads
    hk = h // group
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = offs_m < seq_q
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    o = desc_o.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_base = bh.to(tl.int64) * seq_q
    tl.store(DELTA + row_base + offs_m, delta, mask=rows)
    lse2 = tl.load(LSE + row_base + offs_m, mask=rows, other=0.0) * LOG2E

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_shift = seq_k - seq_q
    if CAUSAL:
        end = tl.minimum(seq_k, start_m + BLOCK_M + causal_shift)
        full_end = tl.minimum((start_m + causal_shift + 1) // BLOCK_N, seq_k // BLOCK_N) * BLOCK_N
    else:
        end = seq_k
        full_end = seq_k // BLOCK_N * BLOCK_N
    dq = _dq_keys(
        dq, q, do, lse2, delta, desc_k, desc_v, b, hk, offs_m, 0, full_end, seq_k, causal_shift, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, WARP_SPEC,
    )  # fmt: skip
    dq = _dq_keys(
        dq, q, do, lse2, delta, desc_k, desc_v, b, hk, offs_m, full_end, end, seq_k, causal_shift, qk_scale,
        HEAD_DIM, BLOCK_N, True, CAUSAL, WARP_SPEC,
    )  # fmt: skip
    desc_dq.store([b, h, start_m, 0], (dq * sm_scale).to(desc_dq.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))


@triton.jit
def dv_and_dscores(
    dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, start_m, seq_q, causal_shift, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """Query tile ``start_m`` of head ``h`` against one key tile, transposed (rows are keys): its ``q``,
    ``dv`` plus ``P^T dO``, and ``dS^T`` in fp32 (the dK/dV programs of both Hopper backwards)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    if MASKED:
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=0.0) * LOG2E
    else:
        lse2 = tl.load(lse_base + offs_m) * LOG2E
    probs_t = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse2[None, :])
    if MASKED:
        visible = offs_m[None, :] < seq_q
        if CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
        probs_t = tl.where(visible, probs_t, 0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
    else:
        delta = tl.load(delta_base + offs_m)
    do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    dv = tl.dot(probs_t.to(do.dtype), do, dv)
    return q, dv, probs_t * (tl.dot(v, do.T) - delta[None, :])


@triton.jit
def _dkdv_queries(
    dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, start, end, seq_q, causal_shift,
    qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """Query tiles ``[start, end)`` of head ``h`` against one key tile, transposed (rows are keys)."""
    for start_m in tl.range(start, end, BLOCK_M, warp_specialize=WARP_SPEC):
        q, dv, dscores_t = dv_and_dscores(
            dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, start_m, seq_q, causal_shift,
            qk_scale, HEAD_DIM, BLOCK_M, MASKED, CAUSAL,
        )  # fmt: skip
        dk = tl.dot(dscores_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def key_tile(
    desc_k, desc_v, tile, bhk, n_kv_heads, seq_q, seq_k,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """A dK/dV program's key tile (both Hopper backwards): ``b, hk, start_n, offs_n``, its ``k, v``, the
    causal shift, ``full_q`` (the rows of whole query tiles) and ``[start, diag_end)``: the query rows whose
    tiles cross the causal diagonal, to be masked (rows before ``start`` see none of these keys); empty when
    not causal."""
    b, hk = bhk // n_kv_heads, bhk % n_kv_heads
    start_n = tile * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    causal_shift = seq_k - seq_q
    full_q = seq_q // BLOCK_M * BLOCK_M
    if CAUSAL:  # query i sees key j iff i >= j - shift: skip earlier query tiles, mask those on the diagonal
        start = tl.maximum(start_n - causal_shift, 0) // BLOCK_M * BLOCK_M
        diag_end = tl.minimum(
            tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_shift, 0), BLOCK_M) * BLOCK_M,
            tl.cdiv(seq_q, BLOCK_M) * BLOCK_M,
        )
    else:
        start = 0
        diag_end = 0
    return b, hk, start_n, offs_n, k, v, causal_shift, full_q, start, diag_end


@triton.jit(do_not_specialize=["n_heads", "group", "n_bhk", "seq_q", "seq_k"])
def dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA,
    n_heads, group, n_bhk, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TILE_MAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """``dK, dV`` of ``BLOCK_N`` keys of one K/V head, over its ``group`` query heads; early keys go first."""
    n_tiles = tl.cdiv(seq_k, BLOCK_N)
    tile, bhk = work_item(tl.program_id(0), n_tiles, n_bhk, TILE_MAJOR)
    b, hk, start_n, offs_n, k, v, causal_shift, full_q, start, diag_end = key_tile(
        desc_k, desc_v, tile, bhk, n_heads // group, seq_q, seq_k, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(group):
        h = hk * group + g
        row_base = (b * n_heads + h).to(tl.int64) * seq_q
        lse_base, delta_base = LSE + row_base, DELTA + row_base
        dk, dv = _dkdv_queries(
            dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, start, diag_end, seq_q,
            causal_shift, qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL, WARP_SPEC,
        )  # fmt: skip
        dk, dv = _dkdv_queries(
            dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, diag_end, full_q, seq_q,
            causal_shift, qk_scale, HEAD_DIM, BLOCK_M, False, CAUSAL, WARP_SPEC,
        )  # fmt: skip
        dk, dv = _dkdv_queries(
            dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, tl.maximum(diag_end, full_q),
            seq_q, seq_q, causal_shift, qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL, WARP_SPEC,
        )  # fmt: skip
    desc_dk.store([b, hk, start_n, 0], (dk * sm_scale).to(desc_dk.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
    desc_dv.store([b, hk, start_n, 0], dv.to(desc_dv.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
