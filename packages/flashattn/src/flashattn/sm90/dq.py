"""Hopper (sm90) attention backward's dQ kernel in Gluon: a TMA producer warp and two consumer warpgroups.

One program owns ``2 * BLOCK_M`` query rows of one (batch, head), ``BLOCK_M`` per consumer warpgroup, and
first writes their ``D = rowsum(O * dO)`` (fp32 ``(batch * heads, seq_q)``) for the dK/dV kernel that runs
next. Then, for every visible key tile ``j``:

    S = Q K_j^T,  dP = dO V_j^T,  P = exp2(S * qk_scale - L_2),  dS = P * (dP - D),  dQ += dS K_j

The load warp brings both halves' ``Q``, ``dO`` and ``O`` once, then streams K and V tiles through
``STAGES`` slots (ready/empty mbarriers per slot for K and for V, released by both consumers). With
``OVERLAP`` a warpgroup issues tile ``j``'s ``S`` and ``dP`` before tile ``j - 1``'s ``dQ`` product and
computes ``dS_j`` while that runs. ``dS`` stays in registers as the A operand of ``dQ += dS K``. Only tiles
crossing the causal diagonal (or a sliding window's edges: ``WINDOW`` walks only the band) or the keys' end
are masked; ``LSE`` is in natural-log units. Deterministic:
each ``dQ`` row is summed by one warpgroup in key order, without atomics.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashattn.sm90.common import key_range, query_tile, ring_barriers

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _load_partition(loads, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The producer: both halves' ``Q, dO, O``, then every K and V tile in order through the slots.
    ``loads = (descs, smem, bars, b, h, hk, start_m, lo, n_kv)``: key tiles ``lo ... lo + n_kv - 1``."""
    descs, smem, bars, b, h, hk, start_m, lo, n_kv = loads
    desc_q, desc_k, desc_v, desc_o, desc_do = descs
    q_smem, do_smem, o_smem, k_smem, v_smem = smem
    row_bar, k_ready, k_empty, v_ready, v_empty = bars
    for half in gl.static_range(2):
        bar = row_bar.index(half)
        m0 = start_m + half * BLOCK_M
        mbarrier.expect(bar, 3 * desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, m0, 0], bar, q_smem.index(half))
        tma.async_copy_global_to_shared(desc_do, [b, h, m0, 0], bar, do_smem.index(half))
        tma.async_copy_global_to_shared(desc_o, [b, h, m0, 0], bar, o_smem.index(half))
    for j in range(n_kv):
        slot = j % STAGES
        free_phase = ((j // STAGES) & 1) ^ 1  # a fresh barrier counts as having completed phase 1
        mbarrier.wait(k_empty.index(slot), free_phase)
        mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
        n0 = (lo + j) * BLOCK_N
        tma.async_copy_global_to_shared(desc_k, [b, hk, n0, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), free_phase)
        mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [b, hk, n0, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _issue_scores(j, walk, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Wait for key tile ``j`` and issue ``S = Q K_j^T`` and ``dP = dO V_j^T`` (asynchronous)."""
    q, do, k_smem, v_smem, k_ready, v_ready, s_zero = walk
    slot = j % STAGES
    phase = (j // STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    s = warpgroup_mma(q, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)  # fmt: skip
    mbarrier.wait(v_ready.index(slot), phase)
    dp = warpgroup_mma(do, v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                       use_acc=False, is_async=True)  # fmt: skip
    return s, dp


@gluon.jit
def _dscores(
    j, s, dp, rows, LATER: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr, s_layout: gl.constexpr,
):  # fmt: skip
    """``dS`` (fp32) of the walk's ``j``-th key tile (tile ``lo + j``) once its products have completed
    (``LATER``: how many products issued after them may still run); its V slot is released. ``rows = (lse2,
    delta, offs_m, lo, mask_until, mask_from, seq_k, lo_off, hi_off, qk_scale, v_empty)``: key tiles below
    ``mask_until`` and from ``mask_from`` on are masked (query ``i`` sees key ``n`` iff ``n < seq_k``, ``n <=
    i + hi_off`` if ``CAUSAL or WINDOW`` and ``n >= i + lo_off`` if ``WINDOW``)."""
    lse2, delta, offs_m, lo, mask_until, mask_from, seq_k, lo_off, hi_off, qk_scale, v_empty = rows
    s = warpgroup_mma_wait(num_outstanding=LATER + 1, deps=(s,))
    p = gl.exp2(s * qk_scale - lse2[:, None])
    if WINDOW:
        tile = lo + j
        masked = (tile >= mask_from) or (tile < mask_until)
    else:  # lo is 0
        tile = j
        masked = j >= mask_from
    if masked:
        offs_n = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = offs_n[None, :] < seq_k
        if CAUSAL or WINDOW:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + hi_off)
        if WINDOW:
            visible = visible & (offs_n[None, :] >= offs_m[:, None] + lo_off)
        p = gl.where(visible, p, 0.0)
    dp = warpgroup_mma_wait(num_outstanding=LATER, deps=(dp,))
    mbarrier.arrive(v_empty.index(j % STAGES), count=1)
    return p * (dp - delta[:, None])


@gluon.jit
def _consumer(
    part, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, OVERLAP: gl.constexpr,
):  # fmt: skip
    """One warpgroup's ``BLOCK_M`` query rows (half ``HALF`` of the program's) over every visible key tile.

    ``part = (out, smem, bars, where)`` with ``out = (desc_dq, LSE, DELTA)`` and ``where = (b, bh, h,
    start_m, lo, n_kv, seq_q, seq_k, lo_off, hi_off, qk_scale, sm_scale)``: key tiles ``lo ... lo + n_kv -
    1``."""
    out, smem, bars, where = part
    desc_dq, LSE, DELTA = out
    b, bh, h, start_m, lo, n_kv, seq_q, seq_k, lo_off, hi_off, qk_scale, sm_scale = where
    q_smem, do_smem, o_smem, k_smem, v_smem = smem
    row_bar, k_ready, k_empty, v_ready, v_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = desc_dq.dtype

    row0 = start_m + HALF * BLOCK_M
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    if CAUSAL or WINDOW:  # the first key tile that some row of this half cannot fully see
        mask_from = gl.minimum((row0 + hi_off + 1) // BLOCK_N, seq_k // BLOCK_N)
    else:
        mask_from = seq_k // BLOCK_N
    # with a window: the first key tile that every row of this half sees from its left edge on
    mask_until = gl.cdiv(gl.maximum(row0 + BLOCK_M - 1 + lo_off, 0), BLOCK_N) if WINDOW else 0
    q = q_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM])
    lse2 = gl.load(LSE + bh.to(gl.int64) * seq_q + offs_m, mask=offs_m < seq_q, other=0.0) * LOG2E
    mbarrier.wait(row_bar.index(HALF), 0)
    delta = gl.sum(o_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM]).load(s_layout).to(gl.float32)
                   * do.load(s_layout).to(gl.float32), 1)  # fmt: skip
    gl.store(DELTA + bh.to(gl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)
    rows = (lse2, delta, offs_m, lo, mask_until, mask_from, seq_k, lo_off, hi_off, qk_scale, v_empty)
    walk = (q, do, k_smem, v_smem, k_ready, v_ready, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout))
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=acc_layout)
    if OVERLAP:  # tile j's S and dP are issued before tile j - 1's dQ product
        s, dp = _issue_scores(0, walk, BLOCK_N, HEAD_DIM, STAGES)
        ds = _dscores(0, s, dp, rows, 0, BLOCK_N, STAGES, CAUSAL, WINDOW, s_layout)
        ds = gl.convert_layout(ds.to(dtype), op_layout)
        for j in range(1, n_kv):
            prev = (j - 1) % STAGES
            s, dp = _issue_scores(j, walk, BLOCK_N, HEAD_DIM, STAGES)
            dq = warpgroup_mma(ds, k_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
            ds_next = _dscores(j, s, dp, rows, 1, BLOCK_N, STAGES, CAUSAL, WINDOW, s_layout)
            ds_next = gl.convert_layout(ds_next.to(dtype), op_layout)
            dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
            mbarrier.arrive(k_empty.index(prev), count=1)
            ds = ds_next
        last = (n_kv - 1) % STAGES
        dq = warpgroup_mma(ds, k_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
        dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
        mbarrier.arrive(k_empty.index(last), count=1)
    else:
        for j in range(n_kv):
            slot = j % STAGES
            s, dp = _issue_scores(j, walk, BLOCK_N, HEAD_DIM, STAGES)
            ds = _dscores(j, s, dp, rows, 0, BLOCK_N, STAGES, CAUSAL, WINDOW, s_layout)
            ds = gl.convert_layout(ds.to(dtype), op_layout)
            dq = warpgroup_mma(ds, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), dq, is_async=True)
            dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))
            mbarrier.arrive(k_empty.index(slot), count=1)
    # this half's Q slot is free once its last S has completed: it stages the output
    dq_tile = q_smem.index(HALF)
    dq_tile.reshape([BLOCK_M, HEAD_DIM]).store((dq * sm_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dq, [b, h, row0, 0], dq_tile)
    tma.store_wait(0)


@gluon.jit
def _consumer_worker(
    part, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, OVERLAP: gl.constexpr,
):  # fmt: skip
    """The second consumer warpgroup: the program's second ``BLOCK_M`` query rows."""
    _consumer(part, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, OVERLAP)


@gluon.jit(do_not_specialize=["n_heads", "group", "seq_q", "seq_k", "left", "right"])
def gluon_dq_kernel(
    desc_q, desc_k, desc_v, desc_o, desc_do, desc_dq, LSE, DELTA, n_heads, group, seq_q, seq_k,
    left, right, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, OVERLAP: gl.constexpr,
):  # fmt: skip
    """Program ``w``: ``D`` and ``dQ`` of ``2 * BLOCK_M`` query rows of one head, heaviest (last) tile first
    within each (batch, head). ``desc_q, desc_o, desc_do, desc_dq`` have ``(1, 1, BLOCK_M, HEAD_DIM)``
    blocks, ``desc_k, desc_v`` ``(1, 1, BLOCK_N, HEAD_DIM)``. ``WINDOW``: query ``i`` sees keys ``i + shift
    - left ... i + shift + right`` (``shift = seq_k - seq_q``, ``right >= -shift``; 0 when ``CAUSAL``); the
    program walks only the key tiles its rows see."""
    ROWS: gl.constexpr = 2 * BLOCK_M
    b, bh, h, hk, start_m = query_tile(ROWS, seq_q, n_heads, group, gl.program_id(0))
    lo_off = seq_k - seq_q - left
    hi_off = seq_k - seq_q + right
    lo, n_kv = key_range(start_m, ROWS, seq_q, seq_k, lo_off, hi_off, BLOCK_N, CAUSAL, WINDOW)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_smem = gl.allocate_shared_memory(desc_do.dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], desc_do.layout)
    o_smem = gl.allocate_shared_memory(desc_o.dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], desc_o.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], desc_v.layout)
    row_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(row_bar.index(i), count=1)
    k_ready, k_empty, v_ready, v_empty = ring_barriers(STAGES, 2)  # both consumers release each slot

    smem = (q_smem, do_smem, o_smem, k_smem, v_smem)
    bars = (row_bar, k_ready, k_empty, v_ready, v_empty)
    where = (b, bh, h, start_m, lo, n_kv, seq_q, seq_k, lo_off, hi_off, qk_scale, sm_scale)
    part = ((desc_dq, LSE, DELTA), smem, bars, where)
    loads = ((desc_q, desc_k, desc_v, desc_o, desc_do), smem, bars, b, h, hk, start_m, lo, n_kv)
    gl.warp_specialize(
        [
            (_consumer, (part, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, OVERLAP)),
            (_consumer_worker, (part, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, OVERLAP)),
            (_load_partition, (loads, BLOCK_M, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [240, 24],
    )
