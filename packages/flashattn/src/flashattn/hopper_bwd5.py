"""Hopper (sm90) attention backward with five tile products: dQ from the dK/dV programs, in a fixed order.

1. :func:`delta_kernel`, one program per (query tile, batch, query head): ``D = rowsum(O * dO)`` of its rows,
   and a zero in the tile's turn counter.
2. :func:`dkdvdq_kernel`, one program per (key tile, batch, K/V head): ``dK, dV`` of its keys summed over
   every query tile of its GQA group in registers, as :func:`flashattn.hopper_bwd.dkdv_kernel` does, and for
   each (query tile m, key tile n) also ``dQ_part = dS @ K``, added into an fp32 accumulator of tile m.

The additions into one dQ tile are serialised in descending key-tile order by its counter: key tile n waits
until the counter equals its turn (the number of visible key tiles after n), adds, and releases the counter
with ``turn + 1``. The first contributor stores without reading; the last (key tile 0, which every query
sees) writes the scaled dQ in the output dtype instead of the accumulator. A fixed order makes repeat runs
bitwise equal, and no data is added atomically.

Deadlock freedom: programs are numbered key tile descending inside each (batch, K/V head), so a program only
waits on programs of lower id, which the GPU dispatched earlier (running or done); the interpreter runs
programs in id order, so there every turn has come when a program asks. Each program walks its query tiles
ascending: causal, key tile n + 1 starts one diagonal step ahead of tile n and stays ahead; non-causal, the
first programs of a wave wait one step each, later waves inherit the stagger from the programs they replace.
"""

import triton
import triton.language as tl

from flashattn.hopper_bwd import dv_and_dscores, key_tile

LOG2E = tl.constexpr(1.4426950408889634)
TURN_STRIDE = tl.constexpr(32)  # int32s between two tiles' counters: one 128-byte line each, no false sharing


@triton.jit(do_not_specialize=["n_heads", "seq_q", "n_m_tiles"])
def delta_kernel(
    desc_o, desc_do, DELTA, TURNS, n_heads, seq_q, n_m_tiles,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """``D`` (fp32, ``(batch * heads, seq_q)``) of ``BLOCK_M`` query rows of one head; resets their turn."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    start_m = tile * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    o = desc_o.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM).to(tl.float32)
    do = desc_do.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * seq_q + offs_m, tl.sum(o * do, 1), mask=offs_m < seq_q)
    tl.store(TURNS + (bh * n_m_tiles + tile) * TURN_STRIDE, 0)


@triton.jit
def _wait_turn(turn_ptr, turn, INTERPRET: tl.constexpr):
    """Wait until ``*turn_ptr == turn`` (every thread spins, acquire at GPU scope); returns 0, for the
    caller's loads to depend on."""
    if INTERPRET:  # programs run one by one in id order: a turn not yet come is an ordering bug, and the
        seen = tl.load(turn_ptr)  # nonzero offset returned then shifts the read, so the tests see it
    else:
        seen = tl.inline_asm_elementwise(
            "{ .reg .pred p; spin: ld.global.acquire.gpu.b32 $0, [$1]; setp.ne.s32 p, $0, $2; @p bra spin; }",
            "=r,l,r", [turn_ptr, turn], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    return seen - turn


@triton.jit
def _pass_turn(turn_ptr, INTERPRET: tl.constexpr):
    """Once every thread has stored its part (a CTA barrier), thread 0 adds 1 with release semantics at GPU
    scope. Written in PTX: Triton stops software-pipelining a loop that holds ``tl.debug_barrier()``."""
    if INTERPRET:
        tl.atomic_add(turn_ptr, 1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 t; bar.sync 0; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "@p red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }",
            "=r,l", [turn_ptr], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def _add_dq(
    dq_part, acc_base, dq_base, stride_dq, turn_ptr, turn, tile, start_m, seq_q, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """Add ``dq_part`` (fp32 ``(BLOCK_M, HEAD_DIM)``) into query tile ``start_m`` at its ``turn``.

    Branch-free (masks instead of ``if``), so that Triton still software-pipelines the loop around it."""
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)[None, :]
    acc = acc_base + rows[:, None] * HEAD_DIM + cols
    ready = _wait_turn(turn_ptr, turn, INTERPRET)
    dq_part += tl.load(acc + ready, mask=turn > 0, other=0.0, cache_modifier=".cg")
    tl.store(acc, dq_part, mask=tile > 0, cache_modifier=".cg")
    last = (tile == 0) & (rows[:, None] < seq_q)  # the last contributor writes the finished tile
    out = (dq_part * sm_scale).to(dq_base.dtype.element_ty)
    tl.store(dq_base + rows[:, None].to(tl.int64) * stride_dq + cols, out, mask=last)
    if tile > 0:
        _pass_turn(turn_ptr, INTERPRET)


@triton.jit
def _queries(
    dk, dv, k, v, desc_q, desc_do, dq_base, stride_dq, lse_base, delta_base, acc_base, turn_base, b, h,
    tile, offs_n, start, end, seq_q, seq_k, causal_shift, n_last_full, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """Query tiles ``[start, end)`` of head ``h`` against key tile ``tile``, transposed (rows are keys)."""
    for start_m in range(start, end, BLOCK_M):
        q, dv, dscores_t = dv_and_dscores(
            dv, k, v, desc_q, desc_do, lse_base, delta_base, b, h, offs_n, start_m, seq_q, causal_shift,
            qk_scale, HEAD_DIM, BLOCK_M, MASKED, CAUSAL,
        )  # fmt: skip
        dscores_t = dscores_t.to(q.dtype)
        if CAUSAL:  # the last key tile the tile's last query sees
            last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
            n_last = tl.minimum(last_row + causal_shift, seq_k - 1) // BLOCK_N
        else:
            n_last = n_last_full
        _add_dq(
            tl.dot(dscores_t.T, k), acc_base, dq_base, stride_dq,
            turn_base + start_m // BLOCK_M * TURN_STRIDE, n_last - tile, tile, start_m, seq_q, sm_scale,
            HEAD_DIM, BLOCK_M, INTERPRET,
        )  # fmt: skip
        dk = tl.dot(dscores_t, q, dk)
    return dk, dv


@triton.jit(do_not_specialize=["n_heads", "group", "seq_q", "seq_k"])
def dkdvdq_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, DQ, stride_dqb, stride_dqh, stride_dqs, LSE, DELTA,
    DQ_ACC, TURNS, n_heads, group, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    INTERPRET: tl.constexpr,
):  # fmt: skip
    """``dK, dV`` of ``BLOCK_N`` keys of one K/V head over its ``group`` query heads, and their dQ parts.

    ``DQ_ACC``: fp32 ``(batch * heads, n_m_tiles * BLOCK_M, HEAD_DIM)``; ``TURNS``: int32 ``(batch * heads,
    n_m_tiles * TURN_STRIDE)``, zeroed by :func:`delta_kernel`; ``DQ``: the output, with its strides."""
    n_tiles = tl.cdiv(seq_k, BLOCK_N)
    pid = tl.program_id(0)
    tile, bhk = n_tiles - 1 - pid % n_tiles, pid // n_tiles  # key tiles descending inside a head
    b, hk, start_n, offs_n, k, v, causal_shift, full_q, start, diag_end = key_tile(
        desc_k, desc_v, tile, bhk, n_heads // group, seq_q, seq_k, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    n_m_tiles = tl.cdiv(seq_q, BLOCK_M)
    for g in range(group):
        h = hk * group + g
        bh = b * n_heads + h
        row_base = bh.to(tl.int64) * seq_q
        lse_base, delta_base = LSE + row_base, DELTA + row_base
        acc_base = DQ_ACC + bh.to(tl.int64) * n_m_tiles * BLOCK_M * HEAD_DIM
        turn_base = TURNS + bh * n_m_tiles * TURN_STRIDE
        dq_base = DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
        dk, dv = _queries(
            dk, dv, k, v, desc_q, desc_do, dq_base, stride_dqs, lse_base, delta_base, acc_base, turn_base, b,
            h, tile, offs_n, start, diag_end, seq_q, seq_k, causal_shift, n_tiles - 1, qk_scale, sm_scale,
            HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, INTERPRET,
        )  # fmt: skip
        dk, dv = _queries(
            dk, dv, k, v, desc_q, desc_do, dq_base, stride_dqs, lse_base, delta_base, acc_base, turn_base, b,
            h, tile, offs_n, diag_end, full_q, seq_q, seq_k, causal_shift, n_tiles - 1, qk_scale, sm_scale,
            HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, INTERPRET,
        )  # fmt: skip
        dk, dv = _queries(
            dk, dv, k, v, desc_q, desc_do, dq_base, stride_dqs, lse_base, delta_base, acc_base, turn_base, b,
            h, tile, offs_n, tl.maximum(diag_end, full_q), seq_q, seq_q, seq_k, causal_shift, n_tiles - 1,
            qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, INTERPRET,
        )  # fmt: skip
    desc_dk.store([b, hk, start_n, 0], (dk * sm_scale).to(desc_dk.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
    desc_dv.store([b, hk, start_n, 0], dv.to(desc_dv.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM))
