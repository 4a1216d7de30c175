"""The mbarriers of the Gluon kernels' shared-memory rings: ``STAGES`` slots, each holding one tile of two
operands (K and V, or Q and dO), that a load warp fills and the consumer warpgroups drain."""

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
