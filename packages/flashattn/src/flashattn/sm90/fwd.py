"""Hopper (sm90) attention forward in Gluon: a TMA producer warp and two consumer warpgroups.

One program owns ``2 * BLOCK_M`` query rows of one (batch, head). Three partitions (``gl.warp_specialize``):

- a load warp (24 registers) brings both query halves once, then streams K and V tiles through ``STAGES``
  shared-memory slots with the copy engine; each slot has its own ready/empty mbarriers for K and for V, so
  the first product of a tile starts as soon as its K has landed;
- two consumer warpgroups (4 warps each, the default partition and one worker), each on ``BLOCK_M`` rows,
  sharing every K/V tile. Inside a warpgroup, ``S_j = Q K_j^T`` is issued asynchronously before the
  softmax of ``S_{j-1}`` and the product ``O += P_{j-1} V_{j-1}`` run, so the tensor cores work while the
  warpgroup does exponentials (FlashAttention-3's intra-warpgroup pipelining); the warp schedulers
  interleave the two warpgroups' products as they come.

``P`` stays in registers as the A operand of the second product (no shared-memory round trip). Scores are in
base-2 units (``qk_scale = log2(e) / sqrt(d)``); only tiles at the causal diagonal or the keys' end are
masked. With a sliding window (``WINDOW``) a program walks only the key tiles of its rows' band and masks
the tiles at both of its edges. Tensors are addressed through 4-D ``(batch, heads, seq, d)`` descriptors
with ``(1, 1, rows, d)`` blocks, so the copy engine zero-fills reads past a sequence's end and clips the
output store there. ``LSE`` is written in natural-log units, fp32 ``(batch * heads, seq_q)``, as the
portable forward writes it.
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

LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _announce(items, bars, w, it, half):
    """Tell consumer ``half`` that the program's ``it``-th item is ``w``, once it has released its query
    rows of the item before (a fresh barrier counts as having completed phase 1); the arrival on its query
    barrier that follows publishes the index."""
    q_empty = bars[1]
    mbarrier.wait(q_empty.index(half), (it & 1) ^ 1)
    items.index(half).store(gl.full([1], w, gl.int32, layout=gl.BlockedLayout([1], [32], [1], [0])))
    gl.thread_barrier()


@gluon.jit
def _load_item(
    loads, w, it, base, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """Load work item ``w``, the program's ``it``-th: every consumer's query rows (persistent: once the
    consumer has released the previous item's, with the item's index), then the item's K and V tiles in
    order, the program's ``t``-th tile (``base`` before the item's first) in slot ``t % STAGES``; return
    ``base`` for the next item."""
    desc_q, desc_k, desc_v, smem, bars, where, _ = loads
    _, n_heads, group, seq_q, seq_k, lo_off, hi_off, _ = where
    q_smem, k_smem, v_smem, _, items = smem
    q_bar, _, k_ready, k_empty, v_ready, v_empty = bars
    ROWS: gl.constexpr = CONSUMERS * BLOCK_M
    b, _, h, hk, start_m = query_tile(ROWS, seq_q, n_heads, group, w)
    lo, n_kv = key_range(start_m, ROWS, seq_q, seq_k, lo_off, hi_off, BLOCK_N, CAUSAL, WINDOW)
    for half in gl.static_range(CONSUMERS):
        if PERSISTENT:
            _announce(items, bars, w, it, half)
        mbarrier.expect(q_bar.index(half), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(
            desc_q, [b, h, start_m + half * BLOCK_M, 0], q_bar.index(half), q_smem.index(half)
        )
    for j in range(n_kv):
        slot = (base + j) % STAGES
        free_phase = (((base + j) // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free_phase)
        mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(
            desc_k, [b, hk, (lo + j) * BLOCK_N, 0], k_ready.index(slot), k_smem.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), free_phase)
        mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(
            desc_v, [b, hk, (lo + j) * BLOCK_N, 0], v_ready.index(slot), v_smem.index(slot)
        )
    return base + n_kv


@gluon.jit
def _load_partition(
    loads, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """The producer: the program's work item, or with ``PERSISTENT`` each item it claims in turn, their K/V
    tiles through one ring. A persistent program starts with item ``program_id`` and claims the next one
    (``G`` plus a count from the ``claims`` counter) once it has issued the last loads of the current one,
    so items start in index order on whichever SM frees up first; an index past the last tells the
    consumers to stop. ``loads = (desc_q, desc_k, desc_v, smem, bars, where, claims)`` with ``where`` as
    :func:`_consumer` takes it."""
    _, _, _, smem, bars, where, claims = loads
    n_items = where[0]
    if PERSISTENT:
        w = gl.program_id(0)
        it = 0
        base = 0
        while w < n_items:
            base = _load_item(loads, w, it, base, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, WINDOW, True)
            w = gl.num_programs(0) + gl.atomic_add(claims, 1)
            it += 1
        q_bar, items = bars[0], smem[4]
        for half in gl.static_range(CONSUMERS):  # no rows to load: the arrival alone publishes the index
            _announce(items, bars, w, it, half)
            mbarrier.arrive(q_bar.index(half), count=1)
    else:
        _load_item(loads, gl.program_id(0), 0, 0, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, WINDOW, False)


@gluon.jit
def _softmax_step(
    s, row_max, row_sum, j, mask, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
    s_layout: gl.constexpr,
):  # fmt: skip
    """Online softmax of the ``j``-th score tile of the loop (key tile ``lo + j``): new row max and sum, the
    rescale factor, and ``P`` (fp32). ``mask = (lo, mask_until, mask_from, offs_m, seq_k, lo_off, hi_off,
    qk_scale)``: key tiles below
    ``mask_until`` and from ``mask_from`` on are masked (query ``i`` sees key ``n`` iff ``n < seq_k``, ``n <=
    i + hi_off`` if ``CAUSAL or WINDOW`` and ``n >= i + lo_off`` if ``WINDOW``). The row max is taken on the
    unscaled scores and scaled once per row, so each score costs one FMA (``s * qk_scale - max``) before its
    exponential instead of a multiply and a subtraction. With a window, a row may have seen no key yet
    (max ``-inf``): it then subtracts 0, so its ``P`` and sum stay 0 instead of NaN."""
    lo, mask_until, mask_from, offs_m, seq_k, lo_off, hi_off, qk_scale = mask
    if WINDOW:
        j = lo + j
        masked = (j >= mask_from) or (j < mask_until)
    else:  # lo is 0: the dense kernels' loop stays as it was
        masked = j >= mask_from
    if masked:
        offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = offs_n[None, :] < seq_k
        if CAUSAL or WINDOW:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + hi_off)
        if WINDOW:
            visible = visible & (offs_n[None, :] >= offs_m[:, None] + lo_off)
        s = gl.where(visible, s, -float("inf"))
    new_max = gl.maximum(row_max, gl.max(s, 1) * qk_scale)  # qk_scale > 0, so the max commutes with it
    safe_max = gl.where(new_max == -float("inf"), 0.0, new_max) if WINDOW else new_max
    alpha = gl.exp2(row_max - safe_max)
    p = gl.exp2(s * qk_scale - safe_max[:, None])
    row_sum = row_sum * alpha + gl.sum(p, 1)
    return p, new_max, row_sum, alpha


@gluon.jit
def _overlapped(
    q, ring, state, mask, n_kv, base, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, s_layout: gl.constexpr,
    o_layout: gl.constexpr, p_layout: gl.constexpr, HALF: gl.constexpr,
):  # fmt: skip
    """The key loop with ``S_j = Q K_j^T`` issued before ``O += P_{j-1} V_{j-1}`` and the softmax of
    ``S_j`` computed while that product runs; ``n_kv + 1`` groups of products. The
    loop's tile ``j`` is the program's ``base + j``-th (:func:`_load_partition`)."""
    k_smem, v_smem, k_ready, k_empty, v_ready, v_empty = ring
    acc, row_max, row_sum = state
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    first = base % STAGES
    mbarrier.wait(k_ready.index(first), (base // STAGES) & 1)
    k_t = k_smem.index(first).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(q, k_t, s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(first), count=1)
    p, row_max, row_sum, alpha = _softmax_step(
        s, row_max, row_sum, 0, mask, BLOCK_N, CAUSAL, WINDOW, s_layout
    )
    p = gl.convert_layout(p.to(q.dtype), p_layout)
    for j in range(1, n_kv):
        t = base + j
        slot = t % STAGES
        prev = (t - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (t // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((t - 1) // STAGES) & 1)
        k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, s_zero, use_acc=False, is_async=True)  # next scores, issued first
        acc = warpgroup_mma(p, v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # the scores are done; P V may still run
        mbarrier.arrive(k_empty.index(slot), count=1)
        p_next, row_max, row_sum, alpha = _softmax_step(
            s, row_max, row_sum, j, mask, BLOCK_N, CAUSAL, WINDOW, s_layout
        )
        p_next = gl.convert_layout(p_next.to(q.dtype), p_layout)
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))  # P's registers are free after this
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p = p_next
    last = (base + n_kv - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((base + n_kv - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_smem.index(last).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    mbarrier.arrive(v_empty.index(last), count=1)
    return acc, row_max, row_sum


@gluon.jit
def _consumer_item(
    part, w, base, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
    CONSUMERS: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """One warpgroup's ``BLOCK_M`` query rows (part ``HALF``) of work item ``w``, whose rows have landed,
    over the item's key tiles (the program's from ``base`` on); return ``base`` for the next item. ``part``
    as :func:`_consumer`."""
    out, smem, bars, where = part
    desc_o, LSE = out
    _, n_heads, group, seq_q, seq_k, lo_off, hi_off, qk_scale = where
    q_smem, k_smem, v_smem, o_smem, _ = smem
    _, q_empty, k_ready, k_empty, v_ready, v_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ROWS: gl.constexpr = CONSUMERS * BLOCK_M
    b, bh, h, _, start_m = query_tile(ROWS, seq_q, n_heads, group, w)
    lo, n_kv = key_range(start_m, ROWS, seq_q, seq_k, lo_off, hi_off, BLOCK_N, CAUSAL, WINDOW)
    row0 = start_m + HALF * BLOCK_M
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    if CAUSAL or WINDOW:  # the first key tile that some row of this part cannot fully see
        mask_from = gl.minimum((row0 + hi_off + 1) // BLOCK_N, seq_k // BLOCK_N)
    else:
        mask_from = seq_k // BLOCK_N
    # with a window: the first key tile that every row of this part sees from its left edge on
    mask_until = gl.cdiv(gl.maximum(row0 + BLOCK_M - 1 + lo_off, 0), BLOCK_N) if WINDOW else 0
    state = (
        gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout),
        gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout)),
        gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout)),
    )
    mask = (lo, mask_until, mask_from, offs_m, seq_k, lo_off, hi_off, qk_scale)
    ring = (k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)
    q = q_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM])
    acc, row_max, row_sum = _overlapped(
        q, ring, state, mask, n_kv, base, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CAUSAL, WINDOW, s_layout,
        o_layout, p_layout, HALF,
    )  # fmt: skip
    o_tile = o_smem.index(HALF)
    if PERSISTENT:  # every product has completed: the load warp may bring the next item's rows
        mbarrier.arrive(q_empty.index(HALF), count=1)
        tma.store_wait(0)  # the previous item's output has left its staging tile
    o = acc / gl.convert_layout(row_sum, gl.SliceLayout(1, o_layout))[:, None]
    o_tile.reshape([BLOCK_M, HEAD_DIM]).store(o.to(desc_o.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [b, h, row0, 0], o_tile)
    lse = (row_max + gl.log2(row_sum)) * LN2
    gl.store(LSE + bh.to(gl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)
    return base + n_kv


@gluon.jit
def _consumer(
    part, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, CONSUMERS: gl.constexpr,
    PERSISTENT: gl.constexpr,
):  # fmt: skip
    """One consumer warpgroup: rows ``HALF`` of the program's work item, or with ``PERSISTENT`` of each of
    its items in turn (:func:`_consumer_item`).

    ``part = (out, smem, bars, where)`` with ``out = (desc_o, LSE)``, ``smem = (q, k, v, o)`` and ``where =
    (n_items, n_heads, group, seq_q, seq_k, lo_off, hi_off, qk_scale)``: query ``i`` sees key ``n`` iff ``i
    + lo_off <= n`` (``WINDOW``) and ``n <= i + hi_off`` (``CAUSAL or WINDOW``)."""
    _, smem, bars, where = part
    n_items = where[0]
    q_bar = bars[0]
    if PERSISTENT:  # each item the load warp announces, until an index past the last
        items = smem[4].index(HALF)
        index_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        mbarrier.wait(q_bar.index(HALF), 0)
        w = gl.max(items.load(index_layout), 0)
        it = 0
        base = 0
        while w < n_items:
            base = _consumer_item(part, w, base, HALF, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW,
                                  CONSUMERS, True)  # fmt: skip
            it += 1
            mbarrier.wait(q_bar.index(HALF), it & 1)
            w = gl.max(items.load(index_layout), 0)
    else:
        mbarrier.wait(q_bar.index(HALF), 0)
        _consumer_item(part, gl.program_id(0), 0, HALF, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW,
                       CONSUMERS, False)  # fmt: skip
    tma.store_wait(0)


@gluon.jit
def _consumer_worker(
    part, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, CONSUMERS: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """The second consumer warpgroup: the second ``BLOCK_M`` query rows of each item."""
    _consumer(part, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, CONSUMERS, PERSISTENT)


@gluon.jit(do_not_specialize=["n_items", "n_heads", "group", "seq_q", "seq_k", "left", "right"])
def gluon_fwd_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, claims, n_items, n_heads, group, seq_q, seq_k, left, right, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, PERSISTENT: gl.constexpr,
):  # fmt: skip
    """Program ``w`` takes work item ``w`` of the ``n_items`` (``PERSISTENT``: ``G`` programs, one an SM,
    each claiming the next unstarted item from the zeroed int32 counter ``claims`` when it is nearly done
    with one), each ``2 * BLOCK_M`` query rows of one (batch, head) (one consumer warpgroup each),
    heaviest (last) tile first within each (batch, head). ``PERSISTENT`` stages outputs in tiles of their
    own, so the next item's rows load while the last item's output is written. ``WINDOW``: query ``i`` sees
    keys ``i + shift - left ... i + shift + right`` (``shift = seq_k - seq_q``, ``right >= -shift``, so
    every query sees a key; ``right`` is 0 when ``CAUSAL``); a program walks only the key tiles its rows
    see."""
    CONSUMERS: gl.constexpr = 2
    lo_off = seq_k - seq_q - left
    hi_off = seq_k - seq_q + right

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], desc_v.layout)
    # one item a program: each consumer stages its output in its own query slot, free once its last Q K^T
    # has completed (o has q's dtype and block, so the same layout): the 32 KB at d 128 that let a third
    # K/V slot fit; persistent, the next item's rows load into that slot while the output is written
    # and the load warp hands each consumer its next item's index in ``items``
    if PERSISTENT:
        o_smem = gl.allocate_shared_memory(desc_o.dtype, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], desc_o.layout)
        items = gl.allocate_shared_memory(gl.int32, [CONSUMERS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        o_smem = q_smem
        items = q_smem  # not read
    q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    k_ready, k_empty, v_ready, v_empty = ring_barriers(STAGES, CONSUMERS)  # every consumer releases each slot

    smem = (q_smem, k_smem, v_smem, o_smem, items)
    bars = (q_bar, q_empty, k_ready, k_empty, v_ready, v_empty)
    where = (n_items, n_heads, group, seq_q, seq_k, lo_off, hi_off, qk_scale)
    part = ((desc_o, LSE), smem, bars, where)
    loads = (desc_q, desc_k, desc_v, smem, bars, where, claims)
    # workers: the second consumer (4 warps) and the loader (1 warp, 24 registers); the default partition
    # (the first consumer) gets the rest of maxnreg's budget: 240 registers
    gl.warp_specialize(
        [
            (_consumer, (part, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, CONSUMERS, PERSISTENT)),
            (_consumer_worker,
             (part, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, CONSUMERS, PERSISTENT)),
            (_load_partition, (loads, BLOCK_M, BLOCK_N, STAGES, CONSUMERS, CAUSAL, WINDOW, PERSISTENT)),
        ],
        [4, 1],
        [240, 24],
    )  # fmt: skip
