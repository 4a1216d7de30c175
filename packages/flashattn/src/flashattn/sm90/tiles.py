"""Launch shapes of the sm90 Gluon kernels, one table entry per head dim (bf16 and fp16 share entries).

Chosen on an H200 at (1, 32, S, 128), S = 8192 and 32 768, with the benchmarks of ``flashattn_bench.sm90``
(docs/flashattn.md, sm90 section); d 64 follows d 128's reasoning. Forward: two 64-row consumer warpgroups and
128-key tiles; at d 128 two K/V slots fill 197 KB of the 227 KB of shared memory (a third would not fit), at
d 64 three take 132 KB. The persistent forward was 2-6% faster at d 64 in every run; at d 128 it was faster or
slower by machine, so not there.
"""

from typing import NamedTuple

CONSUMERS = 2  # consumer warpgroups per program, each with its own rows (forward, dQ) or keys (dK/dV)


class ForwardTile(NamedTuple):
    """The forward: each of the two consumer warpgroups owns ``block_m`` query rows; both share
    ``block_n``-key K/V tiles held in ``stages`` shared-memory slots. ``persistent``: one program per SM,
    each claiming the next unstarted query tile from a counter, its outputs staged apart from its query rows
    so that the next tile's load overlaps the last one's epilogue."""

    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    persistent: bool = False


class DqTile(NamedTuple):
    """The dQ kernel: two consumer warpgroups of ``block_m`` query rows share ``block_n``-key K/V tiles in
    ``stages`` slots; ``overlap`` issues the next tile's ``S, dP`` products before the current ``dQ`` one."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 3
    overlap: bool = True


class DkdvTile(NamedTuple):
    """The dK/dV kernel: two consumer warpgroups of ``block_n`` keys each walk query tiles of ``block_m``
    rows held in ``stages`` slots (three: a warpgroup holds two tiles while the next loads);
    ``gqa_tile_major``: causal GQA calls order the programs longest-first over every (batch, K/V head), not
    head after head (few, long programs: the last heads' heaviest ones would start late)."""

    block_n: int = 64
    block_m: int = 64
    stages: int = 3
    gqa_tile_major: bool = True


class Sm90Tiles(NamedTuple):
    """The three kernels' launch shapes for one head dim."""

    forward: ForwardTile
    dq: DqTile
    dkdv: DkdvTile


TILES: dict[int, Sm90Tiles] = {
    128: Sm90Tiles(ForwardTile(stages=2), DqTile(), DkdvTile()),
    64: Sm90Tiles(ForwardTile(stages=3, persistent=True), DqTile(block_n=128, stages=2, overlap=False),
                  DkdvTile()),
}  # fmt: skip


def max_registers() -> int:
    """Registers per thread at entry: the SM's 65 536 over every warp (the loader warp rounds up to a
    warpgroup), a multiple of 8; the partitions then move registers from the loader to the consumers."""
    return 65536 // (32 * 4 * (CONSUMERS + 1)) // 8 * 8
