"""Launch shapes of the Hopper (sm90) kernels: one tile tuple per kernel, the table of them per head dim that
:mod:`flashattn.hopper`'s launchers read (:func:`configs_for`), and :func:`pinned_configs`, which tests and
``flashattn.hopper_bench`` use to launch other shapes."""

from contextlib import AbstractContextManager
from typing import NamedTuple

from flashattn.pinning import Pin


class HopperTile(NamedTuple):
    """Launch shape of one kernel: ``block_m`` queries and ``block_n`` keys per tile.

    ``persistent``: one program per SM striding the work items (forward only); ``tile_major``: the
    heaviest causal tile of every head first (else every tile of one head, heaviest first, then the next);
    ``warp_spec``: Triton's automatic warp specialisation of the inner loop (producer/consumer warps).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    persistent: bool = False
    tile_major: bool = False
    warp_spec: bool = False


class GluonTile(NamedTuple):
    """Launch shape of the Gluon forward: ``consumers`` warpgroups (1 or 2) of ``block_m`` query rows each
    share ``block_n``-key K/V tiles held in ``stages`` shared-memory slots; ``overlap`` pipelines each
    warpgroup's key loop (the next ``Q K^T`` issued before the current softmax); ``pingpong`` makes two
    overlapped consumers take turns to issue their products; ``persistent``: one program per SM, each
    claiming the next unstarted query tile from a counter, its outputs staged apart from its query rows so
    that the next tile's load overlaps the last one's epilogue."""

    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    consumers: int = 2
    overlap: bool = True
    pingpong: bool = False
    persistent: bool = False

    def maxnreg(self) -> int:
        """Registers per thread at entry: the SM's 65 536 over every warp (the loader warp rounds up to a
        warpgroup), a multiple of 8; the partitions then move registers from the loader to the consumers."""
        return 65536 // (32 * 4 * (self.consumers + 1)) // 8 * 8


class GluonBwdTile(NamedTuple):
    """Launch shape of the Gluon dK/dV kernel: two consumer warpgroups of ``block_n`` keys each walk query
    tiles of ``block_m`` rows held in ``stages`` shared-memory slots; ``overlap`` issues the next tile's
    ``S^T, dP^T`` products before the current ``dV, dK`` ones (overlapped, a warpgroup holds two tiles, so
    a third slot is needed to load ahead); ``gqa_tile_major``: causal GQA calls order the programs
    longest-first over every (batch, K/V head), not head after head (few, long programs: the last heads'
    heaviest ones would start late)."""

    block_n: int = 64
    block_m: int = 64
    stages: int = 3
    overlap: bool = True
    gqa_tile_major: bool = True


class GluonDqTile(NamedTuple):
    """Launch shape of the Gluon dQ kernel: two consumer warpgroups of ``block_m`` query rows share
    ``block_n``-key K/V tiles held in ``stages`` slots; ``overlap`` issues the next tile's ``S, dP`` products
    before the current ``dQ`` one."""

    block_m: int = 64
    block_n: int = 64
    stages: int = 3
    overlap: bool = True


class GluonBwd5Tile(NamedTuple):
    """Launch shape of the five-product Gluon kernel: :class:`GluonBwdTile`'s tiles, always overlapped;
    ``early_dq`` issues a step's ``dQ`` products before the next step's softmax (else after it),
    ``defer_stage`` stages a step's ``dQ`` part after the step two on has issued its ``S, dP`` (else as soon
    as it is done)."""

    block_n: int = 64
    block_m: int = 64
    stages: int = 3
    early_dq: bool = False
    defer_stage: bool = True


class HopperConfigs(NamedTuple):
    """One :class:`HopperTile` per Triton-language kernel (``dkdv`` and ``dkdvdq`` programs own ``block_n``
    keys, the others ``block_m``) and the Gluon forward's :class:`GluonTile`."""

    forward: HopperTile
    dkdv: HopperTile
    dq: HopperTile
    gluon: GluonTile = GluonTile()
    dkdvdq: HopperTile = HopperTile(64, 128, 8, 3)
    gluon_dkdv: GluonBwdTile = GluonBwdTile()
    gluon_dq: GluonDqTile | None = GluonDqTile()  # None: the Triton-language dQ kernel
    gluon_dkdvdq: GluonBwd5Tile = GluonBwd5Tile()


# Keyed by head dim (bf16 and fp16 share entries). Chosen with `python -m flashattn.hopper_bench` on an H200
# at (1, 32, S, 128), S = 8192 and 32768 (docs/flashattn.md, Hopper section); d 64 follows d 128's reasoning.
# Gluon: two 64-row consumers and 128-key tiles; at d 128 two K/V slots fill 197 KB of the 227 KB of shared
# memory (a third would not fit), at d 64 three take 132 KB. The persistent forward is 2-6% faster at d 64 in
# every run (docs/flashattn.md, "Claimed items"); at d 128 it was faster or slower by machine, so not there.
_CONFIGS: dict[int, HopperConfigs] = {
    128: HopperConfigs(HopperTile(128, 128, 8, 3), HopperTile(64, 128, 8, 3), HopperTile(128, 64, 8, 3),
                       GluonTile(stages=2)),
    64: HopperConfigs(HopperTile(128, 128, 8, 3), HopperTile(64, 128, 8, 3), HopperTile(128, 64, 8, 3),
                      GluonTile(stages=3, persistent=True),
                      gluon_dq=GluonDqTile(block_n=128, stages=2, overlap=False)),
}  # fmt: skip
_pin: Pin[HopperConfigs] = Pin()


def configs_for(head_dim: int) -> HopperConfigs:
    """The tile table's entry for ``head_dim``, or the one pinned by :func:`pinned_configs`."""
    return _pin.value if _pin.value is not None else _CONFIGS[head_dim]


def pinned_configs(configs: HopperConfigs) -> AbstractContextManager[None]:
    """Use ``configs`` for every launch inside the ``with`` block (tests and the ablation pin them)."""
    return _pin.pinned(configs)
