"""Hopper (sm90) attention backward's dK/dV kernel in Gluon: a TMA producer warp and two consumer warpgroups.

One program owns ``2 * BLOCK`` keys of one (batch, K/V head); each consumer warpgroup keeps ``BLOCK`` of them
(its K, V tile in shared memory, its ``dK, dV`` in fp32 registers) and both walk the same query tiles of every
query head of the GQA group:

    S = Q K^T,  dP = dO V^T,  P = exp2(S * qk_scale - L_2),  dS = P * (dP - D),  dV += P^T dO,  dK += dS^T Q

Rows of ``S`` are queries, so ``L`` and ``D`` are row vectors (two registers a thread); ``P`` and ``dS`` go
through shared memory (two buffers each per warpgroup) to be read transposed as the A operands of the last
two products, which frees their registers. A load warp streams the ``Q`` and ``dO`` tiles through ``STAGES``
shared-memory slots (ready/empty mbarriers per slot, released by both consumers). A
warpgroup issues the next tile's ``S`` and ``dP`` before the current ``dV, dK`` products and computes the next
``P`` and ``dS`` while those run (it then holds two query tiles: a third slot loads ahead). Query tiles that
see none of the program's keys are skipped (causal: the walk starts at the first that does; a sliding
window, ``WINDOW``, also ends it at the last); only tiles crossing the diagonal or the band's edges are
masked. ``D = rowsum(O * dO)`` comes from the dQ kernel, which runs first; ``LSE`` is in
natural-log units, fp32 ``(batch * heads, seq_q)``. Deterministic: every output element is summed by one
warpgroup in a fixed order, and no data is added atomically.
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

from flashattn.sm90.common import ring_barriers

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _tile(i, first_m, count, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """Step ``i`` of a program's walk over ``count`` query tiles per head: its slot, the slot's phase, the
    head's index in the group and the tile's first query row."""
    return i % STAGES, (i // STAGES) & 1, i // count, (first_m + i % count) * BLOCK_M


@gluon.jit
def _load_partition(loads, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """The producer: both key halves' K and V once, then every query tile's ``Q`` and ``dO`` in order.
    ``loads = (desc_q, desc_k, desc_v, desc_do, smem, bars, b, hk, group, start_n, first_m, count)``."""
    desc_q, desc_k, desc_v, desc_do, smem, bars, b, hk, group, start_n, first_m, count = loads
    k_smem, v_smem, q_smem, do_smem, _, _ = smem
    kv_bar, q_ready, q_empty, do_ready, do_empty = bars
    mbarrier.expect(kv_bar, 4 * desc_k.block_type.nbytes)
    for half in gl.static_range(2):
        n0 = start_n + half * BLOCK
        tma.async_copy_global_to_shared(desc_k, [b, hk, n0, 0], kv_bar, k_smem.index(half))
        tma.async_copy_global_to_shared(desc_v, [b, hk, n0, 0], kv_bar, v_smem.index(half))
    for i in range(group * count):
        slot, phase, g, m0 = _tile(i, first_m, count, BLOCK_M, STAGES)
        h = hk * group + g
        mbarrier.wait(q_empty.index(slot), phase ^ 1)  # a fresh barrier counts as having completed phase 1
        mbarrier.expect(q_ready.index(slot), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [b, h, m0, 0], q_ready.index(slot), q_smem.index(slot))
        mbarrier.wait(do_empty.index(slot), phase ^ 1)
        mbarrier.expect(do_ready.index(slot), desc_do.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_do, [b, h, m0, 0], do_ready.index(slot), do_smem.index(slot))


@gluon.jit
def _issue_s(i, walk, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Wait for step ``i``'s ``Q`` and issue ``S = Q K^T`` (asynchronous)."""
    k_t, _, q_smem, _, q_ready, _, s_zero, first_m, count = walk
    slot, phase, _, _ = _tile(i, first_m, count, BLOCK_M, STAGES)
    mbarrier.wait(q_ready.index(slot), phase)
    q = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
    return warpgroup_mma(q, k_t, s_zero, use_acc=False, is_async=True)


@gluon.jit
def _issue_dp(i, walk, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Wait for step ``i``'s ``dO`` and issue ``dP = dO V^T`` (asynchronous)."""
    _, v_t, _, do_smem, _, do_ready, s_zero, first_m, count = walk
    slot, phase, _, _ = _tile(i, first_m, count, BLOCK_M, STAGES)
    mbarrier.wait(do_ready.index(slot), phase)
    do = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
    return warpgroup_mma(do, v_t, s_zero, use_acc=False, is_async=True)


@gluon.jit
def _issue_scores(i, walk, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Wait for step ``i``'s ``Q, dO`` and issue ``S = Q K^T`` and ``dP = dO V^T`` (asynchronous)."""
    s = _issue_s(i, walk, BLOCK_M, HEAD_DIM, STAGES)
    return s, _issue_dp(i, walk, BLOCK_M, HEAD_DIM, STAGES)


@gluon.jit
def _stage_operands(
    i, s, dp, where, LATER: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr, s_layout: gl.constexpr,
):  # fmt: skip
    """Once step ``i``'s two products have completed (``LATER``: how many issued after them may still run),
    write its ``P`` and ``dS`` into buffer ``buf + i % 2`` of ``p_smem, ds_smem`` for the ``dV, dK``
    products. ``where = (LSE, DELTA, p_smem, ds_smem, buf, n_heads, b, hk, group, n0, first_m, count, seq_q,
    hi_off, qk_scale, lo_off)``. Tiles are masked only where they cross an edge of what queries see (query
    ``i`` sees key ``j`` iff ``j <= i + hi_off`` if ``CAUSAL or WINDOW``, and ``j >= i + lo_off`` if
    ``WINDOW``); queries past ``seq_q`` are zero rows of ``Q`` and ``dO`` and add nothing."""
    (LSE, DELTA, p_smem, ds_smem, buf, n_heads, b, hk, group, n0, first_m, count, seq_q, hi_off,
     qk_scale, lo_off) = where  # fmt: skip
    _, _, g, m0 = _tile(i, first_m, count, BLOCK_M, 1)
    row_base = (b * n_heads + hk * group + g).to(gl.int64) * seq_q
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse2 = gl.load(LSE + row_base + offs_m, mask=offs_m < seq_q, other=0.0) * LOG2E
    delta = gl.load(DELTA + row_base + offs_m, mask=offs_m < seq_q, other=0.0)
    s = warpgroup_mma_wait(num_outstanding=LATER + 1, deps=(s,))
    p = gl.exp2(s * qk_scale - lse2[:, None])
    if WINDOW:
        if (m0 + hi_off < n0 + BLOCK - 1) or (m0 + BLOCK_M - 1 + lo_off > n0):
            offs_n = n0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
            rel = offs_n[None, :] - offs_m[:, None]
            seen = (rel <= hi_off) & (rel >= lo_off)
            p = gl.where(seen, p, 0.0)
    elif CAUSAL:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if m0 + hi_off < n0 + BLOCK - 1:
            offs_n = n0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
            p = gl.where(offs_n[None, :] <= offs_m[:, None] + hi_off, p, 0.0)
    p_smem.index(buf + i % 2).store(p.to(p_smem.dtype))
    dp = warpgroup_mma_wait(num_outstanding=LATER, deps=(dp,))
    ds_smem.index(buf + i % 2).store((p * (dp - delta[:, None])).to(ds_smem.dtype))
    fence_async_shared()  # the stores, before the copy engine's and the tensor cores' reads
    gl.thread_barrier()  # every warp of the warpgroup has stored before the next product reads


@gluon.jit
def _issue_grads(i, dk, dv, walk, ops, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Issue step ``i``'s ``dV += P^T dO`` and ``dK += dS^T Q`` (asynchronous); ``ops = (p_smem, ds_smem,
    buf)``."""
    _, _, q_smem, do_smem, _, _, _, first_m, count = walk
    p_smem, ds_smem, buf = ops
    slot, _, _, _ = _tile(i, first_m, count, BLOCK_M, STAGES)
    do = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
    q = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
    dv = warpgroup_mma(p_smem.index(buf + i % 2).permute((1, 0)), do, dv, is_async=True)
    dk = warpgroup_mma(ds_smem.index(buf + i % 2).permute((1, 0)), q, dk, is_async=True)
    return dk, dv


@gluon.jit
def consumer_state(
    smem, q_ready, do_ready, where, LSE, DELTA, HALF: gl.constexpr, s_layout: gl.constexpr
):  # fmt: skip
    """``(n0, ops, walk, grads)`` of the warpgroup that owns key half ``HALF`` of a dK/dV program: its first
    key, its ``P, dS`` buffers, and the tuples :func:`_issue_scores` and :func:`_stage_operands` take.
    ``smem`` (K, V, Q, dO, P, dS) and ``where`` as :func:`_consumer` takes them; ``s_layout``: ``S``'s."""
    b, hk, n_heads, group, start_n, first_m, count, seq_q, _, qk_scale, _, lo_off, hi_off = where
    k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem = smem
    BLOCK: gl.constexpr = k_smem.shape[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    n0 = start_n + HALF * BLOCK
    k_t = k_smem.index(HALF).reshape([BLOCK, HEAD_DIM]).permute((1, 0))
    v_t = v_smem.index(HALF).reshape([BLOCK, HEAD_DIM]).permute((1, 0))
    s_zero = gl.zeros([BLOCK_M, BLOCK], gl.float32, layout=s_layout)
    walk = (k_t, v_t, q_smem, do_smem, q_ready, do_ready, s_zero, first_m, count)
    grads = (LSE, DELTA, p_smem, ds_smem, 2 * HALF, n_heads, b, hk, group, n0, first_m, count, seq_q,
             hi_off, qk_scale, lo_off)  # fmt: skip
    return n0, (p_smem, ds_smem, 2 * HALF), walk, grads


@gluon.jit
def _store_grads(dk, dv, k_out, v_out, desc_dk, desc_dv, coord):
    """Write fp32 ``dk, dv`` (``(BLOCK, HEAD_DIM)``, scaled) in the outputs' dtype through the shared-memory
    tiles ``k_out, v_out`` (``(1, 1, BLOCK, HEAD_DIM)``, free to overwrite) to ``coord`` of both outputs."""
    k_out.reshape([dk.shape[0], dk.shape[1]]).store(dk.to(desc_dk.dtype))
    v_out.reshape([dv.shape[0], dv.shape[1]]).store(dv.to(desc_dv.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dk, coord, k_out)
    tma.async_copy_shared_to_global(desc_dv, coord, v_out)
    tma.store_wait(0)


@gluon.jit
def _walk(
    dk, dv, walk, ops, grads, bars, n_steps, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr,
    HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
    s_layout: gl.constexpr,
):  # fmt: skip
    """``dK, dV`` summed over the ``n_steps >= 1`` query tiles of the walk; every slot released after use.
    ``bars = (q_empty, do_empty)``."""
    q_empty, do_empty = bars
    # step i's S and dP are issued before step i - 1's dV and dK products
    s, dp = _issue_scores(0, walk, BLOCK_M, HEAD_DIM, STAGES)
    _stage_operands(0, s, dp, grads, 0, BLOCK, BLOCK_M, CAUSAL, WINDOW, s_layout)
    for i in range(1, n_steps):
        s, dp = _issue_scores(i, walk, BLOCK_M, HEAD_DIM, STAGES)
        dk, dv = _issue_grads(i - 1, dk, dv, walk, ops, BLOCK_M, HEAD_DIM, STAGES)
        _stage_operands(i, s, dp, grads, 2, BLOCK, BLOCK_M, CAUSAL, WINDOW, s_layout)
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
        prev = (i - 1) % STAGES
        mbarrier.arrive(q_empty.index(prev), count=1)
        mbarrier.arrive(do_empty.index(prev), count=1)
    dk, dv = _issue_grads(n_steps - 1, dk, dv, walk, ops, BLOCK_M, HEAD_DIM, STAGES)
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    last = (n_steps - 1) % STAGES
    mbarrier.arrive(q_empty.index(last), count=1)
    mbarrier.arrive(do_empty.index(last), count=1)
    return dk, dv


@gluon.jit
def _consumer(
    part, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
):  # fmt: skip
    """One warpgroup's ``BLOCK`` keys (half ``HALF`` of the program's) over every query tile of the group
    that sees them (none: zero ``dK, dV``, possible only with a window).

    ``part = (out, smem, bars, where)`` with ``out = (desc_dk, desc_dv, LSE, DELTA)`` and ``where = (b, hk,
    n_heads, group, start_n, first_m, count, seq_q, seq_k, qk_scale, sm_scale, lo_off, hi_off)``."""
    out, smem, bars, where = part
    desc_dk, desc_dv, LSE, DELTA = out
    b, hk, _, group, _, _, count, _, _, _, sm_scale, _, _ = where
    k_smem, v_smem = smem[0], smem[1]
    kv_bar, q_ready, q_empty, do_ready, do_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK, 16])  # fmt: skip
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])  # fmt: skip

    n0, ops, walk, grads = consumer_state(smem, q_ready, do_ready, where, LSE, DELTA, HALF, s_layout)
    dk = gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=acc_layout)
    n_steps = group * count
    mbarrier.wait(kv_bar, 0)  # also before K and V's slots stage the outputs
    walked = (dk, dv, walk, ops, grads, (q_empty, do_empty), n_steps)
    if WINDOW:  # a compile-time branch: the dense kernels need no test (and spill with it at d 128)
        if n_steps > 0:  # a window can leave the keys without queries
            dk, dv = _walk(*walked, BLOCK, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, WINDOW, s_layout)
    else:
        dk, dv = _walk(*walked, BLOCK, BLOCK_M, HEAD_DIM, STAGES, CAUSAL, WINDOW, s_layout)
    # K and V of this half are read by this warpgroup only: their slots stage its outputs
    _store_grads(dk * sm_scale, dv, k_smem.index(HALF), v_smem.index(HALF), desc_dk, desc_dv, [b, hk, n0, 0])


@gluon.jit
def _consumer_worker(
    part, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
):  # fmt: skip
    """The second consumer warpgroup: the program's second ``BLOCK`` keys."""
    _consumer(part, 1, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, WINDOW)


@gluon.jit
def key_program(
    seq_q, seq_k, n_heads, group, lo_off, hi_off, KEYS: gl.constexpr, BLOCK_M: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, DESCENDING: gl.constexpr, TILE_MAJOR: gl.constexpr,
):  # fmt: skip
    """``(tile, start_n, b, hk, first_m, count)`` of program ``program_id(0)``, which owns ``KEYS`` keys of
    one (batch, K/V head): key tile ``tile`` of its head (ascending with the program id inside each head,
    the most causal work first, or ``DESCENDING``; ``TILE_MAJOR``: the first key tile of every head, then
    the second, and so on), and the ``count`` query tiles from ``first_m`` on that
    see any of its keys (query ``i`` sees key ``j`` iff ``j <= i + hi_off`` if ``CAUSAL or WINDOW``, and
    ``j >= i + lo_off`` if ``WINDOW``; a window can leave ``count`` at 0)."""
    n_tiles = gl.cdiv(seq_k, KEYS)
    w = gl.program_id(0)
    if TILE_MAJOR:
        n_bhk = gl.num_programs(0) // n_tiles
        bhk, rank = w % n_bhk, w // n_bhk
    else:
        bhk, rank = w // n_tiles, w % n_tiles
    tile = n_tiles - 1 - rank if DESCENDING else rank
    start_n = tile * KEYS
    n_kv_heads = n_heads // group
    if WINDOW:  # the queries from the first key's first to the last key's last
        first_row = gl.maximum(start_n - hi_off, 0)
        last_row = gl.minimum(gl.minimum(start_n + KEYS, seq_k) - 1 - lo_off, seq_q - 1)
        first_m = first_row // BLOCK_M
        count = gl.where(last_row >= first_row, last_row // BLOCK_M + 1 - first_m, 0)
    else:
        if CAUSAL:  # noqa: SIM108 (earlier query tiles see none of the keys)
            first_m = gl.maximum(start_n - hi_off, 0) // BLOCK_M
        else:
            first_m = 0
        count = gl.cdiv(seq_q, BLOCK_M) - first_m
    return tile, start_n, bhk // n_kv_heads, bhk % n_kv_heads, first_m, count


@gluon.jit
def allocate_operands(desc_q, desc_k, desc_v, desc_do, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr,
                      STAGES: gl.constexpr):  # fmt: skip
    """Shared memory of a dK/dV program: both key halves' K, V; ``STAGES`` Q/dO slots; two ``P`` and two
    ``dS`` buffers per warpgroup; and the K/V barrier (initialised)."""
    HEAD_DIM: gl.constexpr = desc_k.block_type.shape[3]
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [2, 1, 1, BLOCK, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [2, 1, 1, BLOCK, HEAD_DIM], desc_v.layout)
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_smem = gl.allocate_shared_memory(desc_do.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], desc_do.layout)
    op_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK], desc_q.dtype)
    p_smem = gl.allocate_shared_memory(desc_q.dtype, [4, BLOCK_M, BLOCK], op_layout)  # 2 per warpgroup
    ds_smem = gl.allocate_shared_memory(desc_q.dtype, [4, BLOCK_M, BLOCK], op_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    return k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, kv_bar


@gluon.jit(do_not_specialize=["n_heads", "group", "seq_q", "seq_k", "left", "right"])
def gluon_dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, n_heads, group, seq_q, seq_k,
    left, right, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, TILE_MAJOR: gl.constexpr,
):  # fmt: skip
    """Program ``w``: ``dK, dV`` of ``2 * BLOCK`` keys of one K/V head over its ``group`` query heads; within
    each (batch, K/V head) the earliest keys (the most causal work) go first, or with ``TILE_MAJOR`` the
    earliest keys of every (batch, K/V head) first (longest-first overall). All descriptors have
    ``(1, 1, BLOCK, HEAD_DIM)`` blocks but ``desc_q, desc_do``'s, which have ``(1, 1, BLOCK_M, HEAD_DIM)``.
    ``WINDOW``: query ``i`` sees keys ``i + shift - left ... i + shift + right`` (``shift = seq_k - seq_q``;
    ``right`` is 0 when ``CAUSAL``)."""
    gl.static_assert(BLOCK_M % 64 == 0, "BLOCK_M must be a multiple of 64: S has a warpgroup's 4 x 16 rows")
    lo_off = seq_k - seq_q - left
    hi_off = seq_k - seq_q + right
    _, start_n, b, hk, first_m, count = key_program(seq_q, seq_k, n_heads, group, lo_off, hi_off, 2 * BLOCK,
                                                    BLOCK_M, CAUSAL, WINDOW, False, TILE_MAJOR)  # fmt: skip
    k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, kv_bar = allocate_operands(
        desc_q, desc_k, desc_v, desc_do, BLOCK, BLOCK_M, STAGES
    )
    q_ready, q_empty, do_ready, do_empty = ring_barriers(STAGES, 2)  # both consumers release each slot

    smem = (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem)
    bars = (kv_bar, q_ready, q_empty, do_ready, do_empty)
    where = (b, hk, n_heads, group, start_n, first_m, count, seq_q, seq_k, qk_scale, sm_scale, lo_off, hi_off)
    part = ((desc_dk, desc_dv, LSE, DELTA), smem, bars, where)
    loads = (desc_q, desc_k, desc_v, desc_do, smem, bars, b, hk, group, start_n, first_m, count)
    gl.warp_specialize(
        [
            (_consumer, (part, 0, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, WINDOW)),
            (_consumer_worker, (part, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, WINDOW)),
            (_load_partition, (loads, BLOCK, BLOCK_M, STAGES)),
        ],
        [4, 1],
        [240, 24],
    )
