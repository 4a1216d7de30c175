"""Hopper (sm90) attention backward in five tile products, in Gluon: dK, dV and the dQ parts in one program.

The program of :mod:`flashattn.gluon_bwd` (a TMA load warp, two consumer warpgroups of ``BLOCK`` keys each,
``S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q``) also computes, for every query tile it walks,

    dQ_part = dS K   (64 query rows x HEAD_DIM, over the program's 2 * BLOCK keys)

from the ``dS`` both warpgroups already stage in shared memory: warpgroup ``h`` takes head-dim columns
``[h * HEAD_DIM / 2, (h + 1) * HEAD_DIM / 2)`` over both key halves (two products of ``BLOCK`` keys), so its
accumulator is 32 fp32 registers a thread. It stages that part in shared memory for a fourth partition, one
warp, that adds it into an fp32 accumulator in global memory with the copy engine (a TMA reduce-add in L2):
it waits for the query tile's turn, adds, waits until the addition is complete and passes the turn on. The
staging lives in the step's own Q/dO ring slot once the step's products are done (its 16-bit Q and dO
tiles hold exactly the fp32 part's bytes); the adder, not the consumers, hands the slot back to the load
warp: its Q buffer as soon as the copy engine has read the half staged there, then its dO buffer.

Turns: the additions into one query tile come in descending key-tile order (tile ``t`` goes after every
tile ``> t`` that the query tile sees; the count of those is its turn), so every element of the accumulator
is summed in the same order on every run (bitwise repeatable) and no element is updated by two programs at
once. Programs are numbered key tile descending inside each (batch, K/V head), so a program waits only on
programs of lower id, dispatched earlier; causal, tile ``t + 1`` reaches each query tile one step before tile
``t``. ``TURNS`` (one int32 counter per 128 bytes) and the accumulator are zero at launch; the caller scales
the accumulator into ``dQ`` afterwards.

Synchronisation between the two consumers, per step parity ``j``: ``ds_ready[j]`` (both have stored their
``dS``: the ``dQ`` products may read both halves) and ``ds_free[j]`` (both ``dQ`` products of that step have
completed: the ``dS`` buffers, both K halves and the step's ring slot may be reused); per ring slot,
``dq_full`` (both halves of the step's ``dQ`` part staged there).
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
from triton.language.core import builtin

from flashattn.gluon_bwd import (
    _issue_dp,
    _issue_grads,
    _issue_s,
    _issue_scores,
    _load_partition,
    _stage_operands,
    _store_grads,
    _tile,
    allocate_operands,
    consumer_state,
    key_program,
)
from flashattn.gluon_common import ring_barriers

TURN_STRIDE = gl.constexpr(32)  # int32s between two query tiles' counters: one 128-byte line each
# The staged dQ part's swizzle (and the accumulator descriptor's). With 128-byte rows a half-warp's 8-byte
# stores put rows 2j and 2j + 1 in the same banks (two extra wavefronts a store, measured); 32-byte rows
# avoid that but need four times the copy boxes, and measured 5-6% slower (docs/flashattn.md)
STAGING_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=4))


@builtin
def _reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add shared-memory tile ``src`` into the global tile of ``tensor_desc`` at ``coord`` (a TMA
    reduce-add, performed in L2; asynchronous: one bulk group, waited by ``tma.store_wait``)."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                              src.handle)  # fmt: skip


@gluon.jit
def _wait_turn(turn_ptr, turn):
    """Spin until ``*turn_ptr == turn`` (every lane, acquire loads at GPU scope)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 seen; spin: ld.global.acquire.gpu.b32 seen, [$1]; "
        "setp.ne.s32 p, seen, $2; @p bra spin; mov.b32 $0, 0; }",
        "=r,l,r", [turn_ptr, turn], dtype=gl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def _pass_turn(turn_ptr):
    """Wait until this warp's bulk additions are complete (not only read), then lane 0 adds 1 to the turn
    with release semantics at GPU scope."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 lane; cp.async.bulk.wait_group 0; bar.warp.sync -1; "
        "mov.u32 lane, %laneid; setp.eq.u32 p, lane, 0; @p red.release.gpu.global.add.s32 [$1], 1; "
        "mov.b32 $0, 0; }",
        "=r,l", [turn_ptr], dtype=gl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def _staging(q_smem, do_smem, slot, half: gl.constexpr):
    """Half ``half`` of a step's ``dQ`` part (fp32 ``(1, 1, BLOCK_M, HEAD_DIM / 2)``) lives in the step's
    ring slot once its products are done: the ``Q`` buffer holds half 0, the ``dO`` buffer half 1 (the same
    bytes: ``HEAD_DIM / 2`` fp32 against ``HEAD_DIM`` 16-bit values a row), in :data:`STAGING_LAYOUT`."""
    buffer = q_smem.index(slot) if half == 0 else do_smem.index(slot)
    rows: gl.constexpr = q_smem.shape[3]
    cols: gl.constexpr = q_smem.shape[4] // 2
    return buffer._reinterpret(gl.float32, [1, 1, rows, cols], STAGING_LAYOUT)


@gluon.jit
def _reduce_partition(
    adds, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):  # fmt: skip
    """The adder warp: each step's staged ``dQ`` part into the accumulator at the query tile's turn, then the
    ring slot back to the load warp. ``adds = (desc_acc, TURNS, q_smem, do_smem, dq_full, q_empty, do_empty,
    b, hk, n_heads, group, tile, first_m, count, seq_q, seq_k)``."""
    (desc_acc, TURNS, q_smem, do_smem, dq_full, q_empty, do_empty, b, hk, n_heads, group, tile, first_m,
     count, seq_q, seq_k) = adds  # fmt: skip
    KEYS: gl.constexpr = 2 * BLOCK
    n_m_tiles = gl.cdiv(seq_q, BLOCK_M)
    for i in range(group * count):
        slot, phase, g, m0 = _tile(i, first_m, count, BLOCK_M, STAGES)
        h = hk * group + g
        if CAUSAL:  # the last key tile that the query tile's last row sees
            n_last = (gl.minimum(m0 + BLOCK_M, seq_q) - 1 + seq_k - seq_q) // KEYS
        else:
            n_last = gl.cdiv(seq_k, KEYS) - 1
        turn_ptr = TURNS + ((b * n_heads + h) * n_m_tiles + m0 // BLOCK_M) * TURN_STRIDE
        mbarrier.wait(dq_full.index(slot), phase)
        _wait_turn(turn_ptr, n_last - tile)
        for half in gl.static_range(2):
            _reduce_add(desc_acc, [b, h, m0, half * (HEAD_DIM // 2)],
                        _staging(q_smem, do_smem, slot, half))  # fmt: skip
        # one bulk group a half, read in order: the Q buffer (half 0) may be refilled before the dO buffer
        tma.store_wait(1)
        mbarrier.arrive(q_empty.index(slot), count=1)
        tma.store_wait(0)
        mbarrier.arrive(do_empty.index(slot), count=1)
        _pass_turn(turn_ptr)


@gluon.jit
def _issue_dq(i, k_smem, ds_smem, dq_zero, HALF: gl.constexpr, BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Issue step ``i``'s ``dQ`` columns of half ``HALF``: ``dS_0 K_0[:, cols] + dS_1 K_1[:, cols]`` over both
    warpgroups' keys (asynchronous; both ``dS`` stored)."""
    COLS: gl.constexpr = HEAD_DIM // 2
    k0 = k_smem.index(0).reshape([BLOCK, HEAD_DIM]).slice(HALF * COLS, COLS, dim=1)
    k1 = k_smem.index(1).reshape([BLOCK, HEAD_DIM]).slice(HALF * COLS, COLS, dim=1)
    dq = warpgroup_mma(ds_smem.index(i % 2), k0, dq_zero, use_acc=False, is_async=True)
    return warpgroup_mma(ds_smem.index(2 + i % 2), k1, dq, is_async=True)


@gluon.jit
def _stage_dq(i, dq, q_smem, do_smem, ds_free, dq_full, HALF: gl.constexpr, STAGES: gl.constexpr):
    """Store step ``i``'s ``dQ`` part into the step's ring slot once both warpgroups' products of the step
    are done (``ds_free``), for the adder warp."""
    mbarrier.wait(ds_free.index(i % 2), (i // 2) & 1)
    staged = _staging(q_smem, do_smem, i % STAGES, HALF)
    staged.reshape([dq.shape[0], dq.shape[1]]).store(dq)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(dq_full.index(i % STAGES), count=1)


@gluon.jit
def _consumer(
    part, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr,
    STAGES: gl.constexpr, CAUSAL: gl.constexpr, EARLY_DQ: gl.constexpr, DEFER_STAGE: gl.constexpr,
):  # fmt: skip
    """One warpgroup's ``BLOCK`` keys (half ``HALF``) over every query tile of the group, and head-dim half
    ``HALF`` of every step's ``dQ`` part. ``part = (out, smem, bars, where)`` as in
    :func:`flashattn.gluon_bwd._consumer`, but ``bars = (kv_bar, q_ready, do_ready, ds_ready, ds_free,
    dq_full)`` (the slots are released by the adder)."""
    out, smem, bars, where = part
    desc_dk, desc_dv, LSE, DELTA = out
    b, hk, _, group, _, _, count, _, _, _, sm_scale, _, _ = where
    k_smem, v_smem, q_smem, do_smem, _, ds_smem = smem
    kv_bar, q_ready, do_ready, ds_ready, ds_free, dq_full = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK, 16])  # fmt: skip
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])  # fmt: skip
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM // 2, 16])  # fmt: skip

    n0, ops, walk, grads = consumer_state(smem, q_ready, do_ready, where, LSE, DELTA, HALF, s_layout)
    dk = gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=acc_layout)
    dv = gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=acc_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM // 2], gl.float32, layout=dq_layout)
    n_steps = group * count
    mbarrier.wait(kv_bar, 0)
    s, dp = _issue_scores(0, walk, BLOCK_M, HEAD_DIM, STAGES)
    _stage_operands(0, s, dp, grads, 0, BLOCK, BLOCK_M, CAUSAL, False, s_layout)
    mbarrier.arrive(ds_ready.index(0), count=1)
    dq = dq_zero
    for i in range(1, n_steps):  # step i's S and dP, then step i - 1's dV, dK and dQ products
        s = _issue_s(i, walk, BLOCK_M, HEAD_DIM, STAGES)
        if DEFER_STAGE:  # noqa: SIM102 (a compile-time branch around a run-time one)
            # step i - 2's dQ part, while S runs
            if i >= 2:
                _stage_dq(i - 2, dq, q_smem, do_smem, ds_free, dq_full, HALF, STAGES)
        dp = _issue_dp(i, walk, BLOCK_M, HEAD_DIM, STAGES)
        dk, dv = _issue_grads(i - 1, dk, dv, walk, ops, BLOCK_M, HEAD_DIM, STAGES)
        if EARLY_DQ:  # queued behind dV and dK, while this warpgroup computes P and dS
            mbarrier.wait(ds_ready.index((i - 1) % 2), ((i - 1) // 2) & 1)
            dq = _issue_dq(i - 1, k_smem, ds_smem, dq_zero, HALF, BLOCK, HEAD_DIM)
        mbarrier.wait(ds_free.index(i % 2), ((i // 2) & 1) ^ 1)  # both dQ products of step i - 2 are done
        _stage_operands(i, s, dp, grads, 4 if EARLY_DQ else 2, BLOCK, BLOCK_M, CAUSAL, False, s_layout)
        mbarrier.arrive(ds_ready.index(i % 2), count=1)
        if not EARLY_DQ:
            mbarrier.wait(ds_ready.index((i - 1) % 2), ((i - 1) // 2) & 1)
            dq = _issue_dq(i - 1, k_smem, ds_smem, dq_zero, HALF, BLOCK, HEAD_DIM)
        dk, dv, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dq))
        mbarrier.arrive(ds_free.index((i - 1) % 2), count=1)
        if not DEFER_STAGE:
            _stage_dq(i - 1, dq, q_smem, do_smem, ds_free, dq_full, HALF, STAGES)
    if DEFER_STAGE:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if n_steps >= 2:
            _stage_dq(n_steps - 2, dq, q_smem, do_smem, ds_free, dq_full, HALF, STAGES)
    dk, dv = _issue_grads(n_steps - 1, dk, dv, walk, ops, BLOCK_M, HEAD_DIM, STAGES)
    mbarrier.wait(ds_ready.index((n_steps - 1) % 2), ((n_steps - 1) // 2) & 1)
    dq = _issue_dq(n_steps - 1, k_smem, ds_smem, dq_zero, HALF, BLOCK, HEAD_DIM)
    dk, dv, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dq))
    mbarrier.arrive(ds_free.index((n_steps - 1) % 2), count=1)
    # after the wait in here both warpgroups' dQ products have also read both K halves: K may be rewritten
    _stage_dq(n_steps - 1, dq, q_smem, do_smem, ds_free, dq_full, HALF, STAGES)
    _store_grads(dk * sm_scale, dv, k_smem.index(HALF), v_smem.index(HALF), desc_dk, desc_dv, [b, hk, n0, 0])


@gluon.jit
def _consumer_worker(
    part, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, EARLY_DQ: gl.constexpr, DEFER_STAGE: gl.constexpr,
):  # fmt: skip
    """The second consumer warpgroup: the program's second ``BLOCK`` keys and the right half of ``dQ``."""
    _consumer(part, 1, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, EARLY_DQ, DEFER_STAGE)


@gluon.jit(do_not_specialize=["n_heads", "group", "seq_q", "seq_k"])
def gluon_dkdvdq_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, desc_acc, LSE, DELTA, TURNS, n_heads, group, seq_q,
    seq_k, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, EARLY_DQ: gl.constexpr, DEFER_STAGE: gl.constexpr,
):  # fmt: skip
    """Program ``w``: ``dK, dV`` of ``2 * BLOCK`` keys of one K/V head over its ``group`` query heads, and
    their ``dQ`` parts added into ``desc_acc`` (fp32 ``(B, H, n_m_tiles * BLOCK_M, HEAD_DIM)``, zeroed; blocks
    ``(1, 1, BLOCK_M, HEAD_DIM / 2)``). ``TURNS``: int32, ``TURN_STRIDE`` per (batch, query head, query tile),
    zeroed. Other arguments as :func:`flashattn.gluon_bwd.gluon_dkdv_kernel`'s."""
    gl.static_assert(BLOCK_M == 64, "BLOCK_M must be 64: S has a warpgroup's 4 x 16 rows, dQ one tile")
    # key tiles descending: a program waits only on lower ids
    tile, start_n, b, hk, first_m, count = key_program(
        seq_q, seq_k, n_heads, group, 0, seq_k - seq_q, 2 * BLOCK, BLOCK_M, CAUSAL, False, True, False
    )
    k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, kv_bar = allocate_operands(
        desc_q, desc_k, desc_v, desc_do, BLOCK, BLOCK_M, STAGES
    )
    q_ready, q_empty, do_ready, do_empty = ring_barriers(STAGES, 1)  # the adder warp releases each slot
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):  # one arrival per consumer
        mbarrier.init(ds_ready.index(j), count=2)
        mbarrier.init(ds_free.index(j), count=2)
    dq_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):  # both halves of the step in slot j are staged
        mbarrier.init(dq_full.index(j), count=2)

    smem = (k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem)
    bars = (kv_bar, q_ready, do_ready, ds_ready, ds_free, dq_full)
    where = (b, hk, n_heads, group, start_n, first_m, count, seq_q, seq_k, qk_scale, sm_scale, 0,
             seq_k - seq_q)  # fmt: skip
    part = ((desc_dk, desc_dv, LSE, DELTA), smem, bars, where)
    loads = (desc_q, desc_k, desc_v, desc_do, smem, (kv_bar, q_ready, q_empty, do_ready, do_empty), b, hk,
             group, start_n, first_m, count)  # fmt: skip
    adds = (desc_acc, TURNS, q_smem, do_smem, dq_full, q_empty, do_empty, b, hk, n_heads, group, tile,
            first_m, count, seq_q, seq_k)  # fmt: skip
    gl.warp_specialize(
        [
            (_consumer, (part, 0, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, EARLY_DQ, DEFER_STAGE)),
            (_consumer_worker, (part, HEAD_DIM, BLOCK, BLOCK_M, STAGES, CAUSAL, EARLY_DQ, DEFER_STAGE)),
            (_load_partition, (loads, BLOCK, BLOCK_M, STAGES)),
            (_reduce_partition, (adds, BLOCK, BLOCK_M, HEAD_DIM, STAGES, CAUSAL)),
        ],
        [4, 1, 1],
        [240, 24, 24],
    )
