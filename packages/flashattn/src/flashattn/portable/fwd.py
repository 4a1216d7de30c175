"""Triton forward kernel of FlashAttention-2 and the tile helpers the backward kernels share.

Every kernel sees its tensors through four strides ``(batch, head, seq, d)``: dense ``(B, H, S, d)`` views
pass theirs, packed ``(total, H, d)`` tensors pass a batch stride of 0 and find each document's first row in
the cumulative lengths ``CU_Q`` / ``CU_K`` (``VARLEN``). Head dims that are not a power of two run in the
next power-of-two tile (``HEAD_DIM``) with the extra columns masked to zero (``EVEN_D`` when none are).

Visibility in a tile whose rows are ``r`` and columns ``c``: ``lo_off <= c - r <= hi_off`` and
``c < n_cols``; ``HAS_LO`` / ``HAS_HI`` say whether either bound exists. :func:`column_ranges` splits the
columns a row tile can see into masked edges and an unmasked middle; tiles outside are never visited, so a
window costs ``seq * window``. Scores are in base-2 units (``log2(e) / sqrt(d)`` folded into ``qk_scale``).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
# Whether these kernels were defined for Triton's interpreter (TRITON_INTERPRET=1 when they were defined: the
# decorator decides then, so later changes of the setting do not apply to them)
INTERPRETED: bool = triton.knobs.runtime.interpret
# The lse / D strides follow the length (seq, or the packed total): left unspecialised like the lengths, so a
# kernel compiled at one length (flashattn.precompile's tiny runs) serves every other.
LSE_STRIDES = ("stride_lb", "stride_lh")


@triton.jit
def program_ids(n_tiles, n_heads):
    """This program's tile along the sequence, its batch (or document) and head, the last two as int64."""
    pid = tl.program_id(0)
    bh = pid // n_tiles
    return pid % n_tiles, (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)


@triton.jit
def spans(CU_Q, CU_K, b, seq_q, seq_k, VARLEN: tl.constexpr):
    """First row and length of batch ``b``'s queries and keys (dense: row 0 and the full lengths)."""
    q_start = 0
    k_start = 0
    if VARLEN:
        q_start = tl.load(CU_Q + b)
        seq_q = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        seq_k = tl.load(CU_K + b + 1) - k_start
        q_start = q_start.to(tl.int64)
        k_start = k_start.to(tl.int64)
    return q_start, seq_q, k_start, seq_k


@triton.jit
def column_ranges(
    r0, n_cols, lo_off, hi_off,
    ROWS: tl.constexpr, COLS: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
):  # fmt: skip
    """Column bounds ``start <= full_start <= full_end <= end`` for rows ``[r0, r0 + ROWS)``.

    Tiles from ``start`` to ``end`` hold every visible column; those in ``[full_start, full_end)`` are
    visible from every row and need no mask. ``start``, ``full_start`` and ``full_end`` are multiples of
    ``COLS`` unless they collapse onto ``end``.
    """
    start = 0
    full_start = 0
    end = n_cols
    full_cap = n_cols
    if HAS_LO:
        start = tl.maximum(r0 + lo_off, 0) // COLS * COLS
        full_start = tl.cdiv(tl.maximum(r0 + ROWS - 1 + lo_off, 0), COLS) * COLS
    if HAS_HI:
        end = tl.minimum(end, tl.maximum(r0 + ROWS + hi_off, 0))
        full_cap = tl.minimum(full_cap, tl.maximum(r0 + hi_off + 1, 0))
    full_start = tl.minimum(tl.maximum(full_start, start), end)
    full_end = tl.maximum(full_start, tl.minimum(full_cap // COLS * COLS, end))
    return start, full_start, full_end, end


@triton.jit
def visible(offs_r, offs_c, n_cols, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr):
    """Boolean ``(rows, cols)``: which (row, column) pairs of a masked tile may attend."""
    rel = offs_c[None, :] - offs_r[:, None]
    seen = offs_c[None, :] < n_cols
    if HAS_LO:
        seen = seen & (rel >= lo_off)
    if HAS_HI:
        seen = seen & (rel <= hi_off)
    return seen


@triton.jit
def load_tile(base, offs_r, offs_d, stride_r, stride_d, n_rows, head_dim, MASK_ROWS: tl.constexpr,
              EVEN_D: tl.constexpr):  # fmt: skip
    """``(rows, HEAD_DIM)`` tile; rows past ``n_rows`` (if ``MASK_ROWS``) and padded columns read 0."""
    ptrs = base + offs_r[:, None] * stride_r + offs_d[None, :] * stride_d
    if MASK_ROWS:
        if EVEN_D:
            x = tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < head_dim), other=0.0)
    else:
        if EVEN_D:  # noqa: SIM108 (constexpr branches are resolved at compile time)
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < head_dim, other=0.0)
    return x


@triton.jit
def store_tile(base, x, offs_r, offs_d, stride_r, stride_d, n_rows, head_dim):
    ptrs = base + offs_r[:, None] * stride_r + offs_d[None, :] * stride_d
    mask = (offs_r[:, None] < n_rows) & (offs_d[None, :] < head_dim)
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_inner(
    acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
    offs_m, offs_d, start, end, seq_k, head_dim, lo_off, hi_off, qk_scale,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
    EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Key tiles ``[start, end)`` of one query tile: the online softmax update."""
    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base, offs_n, offs_d, stride_ks, stride_kd, seq_k, head_dim, MASKED, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            seen = visible(offs_m, offs_n, seq_k, lo_off, hi_off, HAS_LO, HAS_HI)
            scores = tl.where(seen, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1) * qk_scale)
        # A row that has seen only -inf scores keeps max -inf; subtracting 0 instead keeps exp2 at 0, not NaN.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.math.exp2(scores * qk_scale - safe_max[:, None])
        rescale = tl.math.exp2(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        v = load_tile(v_base, offs_n, offs_d, stride_vs, stride_vd, seq_k, head_dim, MASKED, EVEN_D)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None], input_precision=PRECISION)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit(
    do_not_specialize=["q_heads", "group", "seq_q", "seq_k", "head_dim", "left", "right", *LSE_STRIDES]
)
def fwd_kernel(
    Q, K, V, OUT, LSE, CU_Q, CU_K,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh,
    q_heads, group, seq_q, seq_k, head_dim, left, right, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, VARLEN: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, batch, query head); the last query tiles (most keys if causal) go first.

    Query head ``h`` reads key/value head ``h // group``. Writes ``o`` and the natural-log ``lse``; a row
    that cannot see any key (only in packed documents) gets ``o = 0`` and ``lse = -inf``.
    """
    n_tiles = tl.cdiv(seq_q, BLOCK_M)  # packed: the longest document's
    tile, b, h = program_ids(n_tiles, q_heads)
    q_start, seq_q, k_start, seq_k = spans(CU_Q, CU_K, b, seq_q, seq_k, VARLEN)
    start_m = (n_tiles - 1 - tile) * BLOCK_M
    if start_m >= seq_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + b * stride_qb + h * stride_qh + q_start * stride_qs
    q = load_tile(q_base, offs_m, offs_d, stride_qs, stride_qd, seq_q, head_dim, True, EVEN_D)
    k_base = K + b * stride_kb + (h // group) * stride_kh + k_start * stride_ks
    v_base = V + b * stride_vb + (h // group) * stride_vh + k_start * stride_vs

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    shift = seq_k - seq_q
    lo_off = shift - left
    hi_off = shift + right
    start, full_start, full_end, end = column_ranges(
        start_m, seq_k, lo_off, hi_off, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:  # key tiles crossing the window's left edge
        acc, row_sum, row_max = _fwd_inner(
            acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
            offs_m, offs_d, start, full_start, seq_k, head_dim, lo_off, hi_off, qk_scale,
            BLOCK_N, True, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
        )  # fmt: skip
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_start, full_end, seq_k, head_dim, lo_off, hi_off, qk_scale,
        BLOCK_N, False, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
    )  # fmt: skip
    acc, row_sum, row_max = _fwd_inner(
        acc, row_sum, row_max, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
        offs_m, offs_d, full_end, end, seq_k, head_dim, lo_off, hi_off, qk_scale,
        BLOCK_N, True, HAS_LEFT, HAS_RIGHT, EVEN_D, PRECISION,
    )  # fmt: skip

    # Rows that cannot see any key (packed documents only) give 0; a row whose visible scores are all -inf
    # gives NaN, as plain softmax does.
    no_key = (offs_m < 0) | (seq_k == 0)
    if HAS_RIGHT:
        no_key = no_key | (offs_m + hi_off < 0)
    o = acc / tl.where(no_key, 1.0, row_sum)[:, None]
    o_base = OUT + b * stride_ob + h * stride_oh + q_start * stride_os
    store_tile(o_base, o, offs_m, offs_d, stride_os, stride_od, seq_q, head_dim)
    lse = (row_max + tl.math.log2(row_sum)) / LOG2E
    tl.store(LSE + b * stride_lb + h * stride_lh + q_start + offs_m, lse, mask=offs_m < seq_q)
