"""Hopper (sm90) attention forward: TMA tensor-descriptor loads, wgmma dots, optional persistent programs.

Tensors are addressed through host-built 4-D descriptors ``(batch, heads, seq, d)`` with blocks of
``(1, 1, rows, d)``: the copy engine fills rows past a sequence's end with zeros and clips stores there, so
any length works without masked loads; only the tiles that hold the causal diagonal or the last keys mask
scores. Scores stay in base-2 units (``log2(e) / sqrt(d)`` folded into ``qk_scale``); ``LSE`` is written in
natural-log units, ``(batch * heads, seq_q)`` fp32, the layout of :mod:`flashattn.triton_flash`.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)  # log2 -> natural log


@triton.jit
def work_item(w, n_tiles, n_bh, TILE_MAJOR: tl.constexpr):
    """Tile index ``0 = heaviest`` and flat batch-head of work item ``w``.

    Head-major (every tile of one head, then the next) keeps one head's K/V hot in L2; tile-major (the
    heaviest tile of every head first) is the global longest-first order for causal work.
    """
    if TILE_MAJOR:
        return w // n_bh, w % n_bh
    return w % n_tiles, w // n_tiles


@triton.jit
def _fwd_keys(
    acc, row_sum, row_max, q, desc_k, desc_v, b, hk, offs_m, start, end, seq_k, causal_shift, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """Online softmax over key tiles ``[start, end)``; ``MASKED`` tiles apply the length and causal masks."""
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPEC):
        k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        scores = tl.dot(q, k.T)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_shift)
            scores = tl.where(visible, scores * qk_scale, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            probs = tl.math.exp2(scores - new_max[:, None])
        else:
            new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
            probs = tl.math.exp2(scores * qk_scale - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None])
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _fwd_tile(
    desc_q, desc_k, desc_v, desc_o, LSE, tile, bh, n_tiles, n_heads, group, seq_q, seq_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """Output rows ``[start_m, start_m + BLOCK_M)`` of one (batch, head); tile 0 is the last (heaviest)."""
    b, h = bh // n_heads, bh % n_heads
    hk = h // group
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
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
    acc, row_sum, row_max = _fwd_keys(
        acc, row_sum, row_max, q, desc_k, desc_v, b, hk, offs_m, 0, full_end, seq_k, causal_shift, qk_scale,
        HEAD_DIM, BLOCK_N, False, CAUSAL, WARP_SPEC,
    )  # fmt: skip
    acc, row_sum, row_max = _fwd_keys(
        acc, row_sum, row_max, q, desc_k, desc_v, b, hk, offs_m, full_end, end, seq_k, causal_shift,
        qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, WARP_SPEC,
    )  # fmt: skip
    o = acc / row_sum[:, None]
    desc_o.store([b, h, start_m, 0], o.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    lse = (row_max + tl.math.log2(row_sum)) * LN2
    tl.store(LSE + bh.to(tl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)


@triton.jit(do_not_specialize=["n_heads", "group", "n_bh", "seq_q", "seq_k"])
def fwd_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, n_heads, group, n_bh, seq_q, seq_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    PERSISTENT: tl.constexpr, TILE_MAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
):  # fmt: skip
    """One work item per program, or (``PERSISTENT``) a grid of one program per SM striding the items.

    ``group = heads_q // heads_kv``: query head ``h`` reads K/V head ``h // group``.
    """
    n_tiles = tl.cdiv(seq_q, BLOCK_M)
    if PERSISTENT:
        for w in tl.range(tl.program_id(0), n_tiles * n_bh, tl.num_programs(0)):
            tile, bh = work_item(w, n_tiles, n_bh, TILE_MAJOR)
            _fwd_tile(
                desc_q, desc_k, desc_v, desc_o, LSE, tile, bh, n_tiles, n_heads, group, seq_q, seq_k,
                qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, WARP_SPEC,
            )  # fmt: skip
    else:
        tile, bh = work_item(tl.program_id(0), n_tiles, n_bh, TILE_MAJOR)
        _fwd_tile(
            desc_q, desc_k, desc_v, desc_o, LSE, tile, bh, n_tiles, n_heads, group, seq_q, seq_k, qk_scale,
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, WARP_SPEC,
        )  # fmt: skip
