"""Pieces the three Gluon kernels share: the mbarriers of their shared-memory rings (``STAGES`` slots, each
holding one tile of two operands, K and V or Q and dO, that a load warp fills and the consumer warpgroups
drain) and the query tile a program owns."""

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
