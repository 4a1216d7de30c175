"""Pieces the three Gluon kernels share: the mbarriers of their shared-memory rings (``STAGES`` slots, each
holding one tile of two operands, K and V or Q and dO, that a load warp fills and the consumer warpgroups
drain), the query tile a work item owns and the key tiles its rows see."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """``(a_ready, a_empty, b_ready, b_empty)``, initialised: per slot and operand a ready barrier (one
    arrival, the load warp's expected bytes) and an empty one (one arrival per consumer warpgroup). Slot
    ``j % STAGES`` holds tile ``j``: the consumers wait on ready with phase ``(j // STAGES) & 1``, the load
    warp on empty with the opposite phase (a fresh barrier counts as having completed phase 1)."""
    a_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    a_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    b_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(a_ready.index(i), count=1)
        mbarrier.init(b_ready.index(i), count=1)
        mbarrier.init(a_empty.index(i), count=CONSUMERS)
        mbarrier.init(b_empty.index(i), count=CONSUMERS)
    return a_ready, a_empty, b_ready, b_empty


@gluon.jit
def query_tile(ROWS: gl.constexpr, seq_q, n_heads, group, w):
    """``(b, bh, h, hk, start_m)`` of work item ``w`` (a program id, or a persistent program's item), which
    owns ``ROWS`` query rows of one (batch, head): the heaviest (last) causal tile of each head first."""
    n_tiles = gl.cdiv(seq_q, ROWS)
    bh = w // n_tiles
    h = bh % n_heads
    return bh // n_heads, bh, h, h // group, (n_tiles - 1 - w % n_tiles) * ROWS


@gluon.jit
def key_range(start_m, ROWS: gl.constexpr, seq_q, seq_k, lo_off, hi_off, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, WINDOW: gl.constexpr):  # fmt: skip
    """``(lo, n_kv)``: the key tiles ``lo ... lo + n_kv - 1`` that query rows ``start_m ... start_m + ROWS -
    1`` see (with a window, from the first row's first key to the last row's last)."""
    if WINDOW:
        lo = gl.maximum(start_m + lo_off, 0) // BLOCK_N
        n_kv = gl.minimum(gl.minimum(start_m + ROWS, seq_q) - 1 + hi_off, seq_k - 1) // BLOCK_N + 1 - lo
    elif CAUSAL:
        lo = 0
        n_kv = gl.cdiv(gl.minimum(seq_k, start_m + ROWS + hi_off), BLOCK_N)
    else:
        lo = 0
        n_kv = gl.cdiv(seq_k, BLOCK_N)
    return lo, n_kv
