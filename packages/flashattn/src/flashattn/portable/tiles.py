"""Tile shapes of the portable Triton kernels, per device: a table measured on Hopper, a rule for the rest.

**The Hopper table** (:data:`_CONFIGS`, one :class:`KernelConfigs` per padded head dim and 16-bit or fp32) was
timed on an H200. The (128, 16-bit) entry won every candidate list of ``flashattn.tune`` at (1, 32, 16384,
128); the fp32 entries for 128 and 64 won ``--dtype fp32 --seq 4096`` (tf32x3 dots, 3-40x faster than the best
IEEE tiles); the (256, 16-bit) entry won ``--head-dim 256 --seq 8192 --heads 16``: forward 128 queries by 64
keys; dK and dV as separate programs (``dv`` set: dK on 128 keys against 32-query steps, dV on 128 keys
against 64-query steps, 1.36x faster together than the best fused dK/dV); dQ 128 queries against 32-key
steps. The others follow the same reasoning. Head dims run in the next power-of-two tile (80 and 96 in 128).

**The rule for every device** (:func:`configs_for`): fit first, then the largest tile of the Hopper entry's
shape that fits, with the warps and stages it allows. Each kernel's candidates are its Hopper tile, then that
tile halved in both sides (each side at least 16, warps halved down to 4) while it does not fit; for each size
the stages run from Hopper's down to the fewest the lowering uses (2 with ``mma.sync``, whose pipeline keeps
``stages - 1`` buffers, else 1). The first candidate whose :func:`shared_bytes` (and, on sm_100,
:func:`tmem_columns`) fits the device is taken; on an H100 / H200 that is always the Hopper entry. Tiles for
devices other than Hopper are untimed. The estimates are upper bounds of what Triton 3.6 allocates, checked
for every chosen tile on sm_80, 86, 89, 90, 100 and 120 by ``python -m flashattn.aot`` (compiled on a CPU).

**Families** (:data:`FAMILIES`; a device takes the nearest at or below its compute capability): how ``tl.dot``
lowers (``mma``: ``mma.sync`` from registers, sm_80 to sm_89 and consumer Blackwell sm_120; ``wgmma``:
sm_90; ``tcgen05``: sm_100, accumulators in 512 columns of tensor memory) and the opt-in shared memory per
block of its reference part, used for compiling ahead of time; a real device's own limit is read from
``torch.cuda.get_device_properties(...).shared_memory_per_block_optin``.
"""

import functools
from typing import NamedTuple

import torch

SHARED_MEMORY_BYTES = 227 * 1024  # one Hopper thread block's opt-in maximum
X3 = "tf32x3"
KERNELS = ("forward", "dkdv", "dk", "dv", "dq")


class TileConfig(NamedTuple):
    """Launch shape of one kernel: ``block_m`` query and ``block_n`` key positions per tile.

    ``fp32_dot`` is how fp32 inputs multiply: ``"ieee"`` (exact fp32 products on the FMA units) or
    ``"tf32x3"`` (each operand split into two TF32 parts, three tensor-core products: about fp32's
    accuracy). 16-bit inputs ignore it.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    fp32_dot: str = "ieee"


class KernelConfigs(NamedTuple):
    """One :class:`TileConfig` per kernel; ``dkdv`` programs own ``block_n`` keys, the others ``block_m``.

    With ``dv`` set, dK and dV run as two programs of one accumulator each: dK with ``dkdv``'s tiles, dV
    with ``dv``'s (one more ``Q K^T`` product per tile, in exchange for half the registers).
    """

    forward: TileConfig
    dkdv: TileConfig
    dq: TileConfig
    dv: TileConfig | None = None


T = TileConfig
_CONFIGS: dict[tuple[int, bool], KernelConfigs] = {
    (256, True): KernelConfigs(T(128, 64, 8, 2), T(32, 128, 8, 2), T(128, 32, 8, 3), dv=T(64, 128, 8, 2)),
    (128, True): KernelConfigs(T(128, 64, 8, 3), T(64, 128, 8, 3), T(128, 64, 8, 3)),
    (64, True): KernelConfigs(T(128, 64, 4, 3), T(64, 128, 8, 3), T(128, 64, 8, 3)),
    (32, True): KernelConfigs(T(128, 64, 4, 3), T(64, 64, 4, 3), T(64, 64, 4, 3)),
    (16, True): KernelConfigs(T(128, 64, 4, 3), T(64, 64, 4, 3), T(64, 64, 4, 3)),
    (256, False): KernelConfigs(T(64, 32, 4, 1, X3), T(16, 32, 4, 2, X3), T(32, 32, 4, 1, X3)),
    (128, False): KernelConfigs(T(128, 32, 8, 2, X3), T(32, 32, 4, 2, X3), T(64, 32, 4, 2, X3)),
    (64, False): KernelConfigs(T(128, 64, 8, 2, X3), T(32, 128, 8, 2, X3), T(128, 32, 8, 2, X3)),
    (32, False): KernelConfigs(T(128, 64, 8, 2, X3), T(32, 128, 8, 2, X3), T(128, 32, 8, 2, X3)),
    (16, False): KernelConfigs(T(128, 64, 8, 2, X3), T(32, 128, 8, 2, X3), T(128, 32, 8, 2, X3)),
}


class Family(NamedTuple):
    """An architecture family: how ``tl.dot`` lowers, its reference part's opt-in shared memory per block
    (bytes) and tensor-memory columns (0: none)."""

    name: str
    lowering: str
    shared_bytes: int
    tmem_columns: int


FAMILIES: dict[tuple[int, int], Family] = {
    (8, 0): Family("sm_80 (A100)", "mma", 163 * 1024, 0),
    (8, 6): Family("sm_86 (RTX 30, A10, A40)", "mma", 99 * 1024, 0),
    (8, 9): Family("sm_89 (RTX 40, L4, L40)", "mma", 99 * 1024, 0),
    (9, 0): Family("sm_90 (H100, H200)", "wgmma", SHARED_MEMORY_BYTES, 0),
    (10, 0): Family("sm_100 (B200)", "tcgen05", SHARED_MEMORY_BYTES, 512),
    (12, 0): Family("sm_120 (RTX 50)", "mma", 99 * 1024, 0),
}


class Target(NamedTuple):
    """What a GPU offers the kernels: its compute capability and a thread block's opt-in shared memory."""

    capability: tuple[int, int]
    shared_bytes: int


HOPPER = Target((9, 0), SHARED_MEMORY_BYTES)


def family_of(target: Target) -> Family:
    """The family of ``target``: the nearest at or below its capability (a newer part runs as its family)."""
    below = [c for c in FAMILIES if c <= target.capability]
    if not below:
        raise ValueError(
            f"flashattn's Triton kernels need compute capability 8.0 or newer, got {target.capability}"
        )
    return FAMILIES[max(below)]


def family_target(capability: int) -> Target:
    """``sm_<capability>`` (e.g. 89) with its family's shared memory per block, for ahead-of-time compiles."""
    cap = divmod(capability, 10)
    return Target(cap, family_of(Target(cap, 0)).shared_bytes)


@functools.cache
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    return Target((props.major, props.minor), props.shared_memory_per_block_optin)


def target_of(device: torch.device) -> Target:
    """The target of ``device``; CPU tensors (run under ``TRITON_INTERPRET=1``) use the Hopper table."""
    if device.type != "cuda":
        return HOPPER
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


def padded_head_dim(head_dim: int) -> int:
    """The power-of-two tile width a head dim runs in (at least 16)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def table() -> dict[tuple[int, bool], KernelConfigs]:
    """A copy of the Hopper tile table, keyed by (padded head dim, 16-bit?)."""
    return dict(_CONFIGS)


# Tiles a kernel keeps for its whole walk and streams per step, in rows of its own / the other block side.
_KEPT_STREAMED = {"forward": (1, 2), "dq": (2, 2), "dkdv": (2, 2), "dk": (2, 2), "dv": (1, 2)}
_VECTORS = {"forward": 0, "dq": 0, "dkdv": 2, "dk": 2, "dv": 1}  # fp32 rows streamed beside (lse, D)


def _rows(kernel: str, cfg: TileConfig) -> tuple[int, int]:
    """(own, other) block sides: dK/dV programs own keys (``block_n``), the others queries."""
    return (cfg.block_n, cfg.block_m) if kernel in ("dkdv", "dk", "dv") else (cfg.block_m, cfg.block_n)


def shared_bytes(kernel: str, cfg: TileConfig, head_dim: int, itemsize: int, target: Target = HOPPER) -> int:
    """Upper bound of a kernel's shared memory (bytes) on ``target``, as Triton 3.6 lays it out.

    The kernel keeps its own tiles (forward ``q``; dQ ``q, dO``; dK/dV ``k, v``; dV alone ``k``) and streams
    the other side's (``k, v`` or ``q, dO``) through a pipeline of buffers: ``stages - 1`` of them with
    ``mma.sync`` (cp.async), ``stages`` with ``wgmma`` and ``tcgen05``. fp32 (tf32x3) keeps a second copy of
    its own tiles. ``tcgen05`` takes the probability / ``dS`` operand from shared memory (one tile in the
    forward, two in the backward kernels); ``mma.sync`` passes it through shared memory at head dim 256 (the
    forward twice: compiled for sm_89, its fp32 32 x 16 tile needs 102 400 bytes, a tile above one count). The
    lse / D rows stream beside; 1 KB covers barriers and row vectors. 16-bit head dims that are not a power of
    two (masked columns) take one more 4 KB buffer with ``mma.sync``: the bf16 d 96 dK/dV kernel (64 x 128,
    two stages) needs 102 912 bytes against 98 816 at d 128, while fp32 at d 192 needs what it needs at d 256
    (``docs/runs/2026-12-07-flashattn-aot``).
    """
    d = padded_head_dim(head_dim)
    lowering = family_of(target).lowering
    kept, streamed = _KEPT_STREAMED[kernel]
    own, other = _rows(kernel, cfg)
    buffers = max(1, cfg.num_stages - 1) if lowering == "mma" else cfg.num_stages
    own_bytes = kept * own * d * itemsize * (2 if itemsize == 4 else 1)
    mma_probs = (2 if kernel == "forward" else 1) if d >= 256 else 0
    probs = {"mma": mma_probs, "wgmma": 0, "tcgen05": 1 if kernel == "forward" else 2}[lowering]
    masked = 4096 if lowering == "mma" and head_dim != d and itemsize == 2 else 0
    return (own_bytes + buffers * (streamed * other * d * itemsize + _VECTORS[kernel] * other * 4)
            + probs * cfg.block_m * cfg.block_n * itemsize + masked + 1024)  # fmt: skip


def tmem_columns(kernel: str, cfg: TileConfig, head_dim: int, itemsize: int, target: Target = HOPPER) -> int:
    """Upper bound of a kernel's tensor-memory columns on ``target`` (0 where ``tl.dot`` does not use it).

    With ``tcgen05`` each fp32 accumulator of 128 (or 64) rows takes one column per output column: the head
    dim for each output (two for dK/dV), and the scores and ``dP`` products, counted twice (Triton may
    double-buffer them); fp32 inputs (three tf32 products each) count four times. Allocations are powers of
    two. Products of fewer than 64 rows lower to ``mma.sync`` and take none (Triton 3.6).
    """
    own, other = _rows(kernel, cfg)
    if family_of(target).lowering != "tcgen05" or own < 64:
        return 0
    outputs, products = {"forward": (1, 1), "dq": (1, 2), "dkdv": (2, 2), "dk": (1, 2), "dv": (1, 1)}[kernel]
    columns = (outputs * padded_head_dim(head_dim) + 2 * products * other) * (4 if itemsize == 4 else 1)
    return 1 << (columns - 1).bit_length()


def fits(kernel: str, cfg: TileConfig, head_dim: int, itemsize: int, target: Target) -> bool:
    """Whether ``cfg`` fits ``target``'s shared memory and tensor memory (by the upper bounds above)."""
    shared = shared_bytes(kernel, cfg, head_dim, itemsize, target)
    return shared <= target.shared_bytes and tmem_columns(kernel, cfg, head_dim, itemsize, target) <= (
        family_of(target).tmem_columns
    )


def candidates(hopper: TileConfig, lowering: str) -> list[TileConfig]:
    """Hopper's tile, then halved in both sides (each at least 16; warps halved down to 4), largest first;
    each size with its stages from Hopper's down to the fewest the lowering pipelines with."""
    fewest = 2 if lowering == "mma" else 1
    found, halvings = [], 0
    while True:
        block_m, block_n = max(16, hopper.block_m >> halvings), max(16, hopper.block_n >> halvings)
        warps = max(4, hopper.num_warps >> halvings)
        for stages in range(max(hopper.num_stages, fewest), fewest - 1, -1):
            found.append(
                hopper._replace(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages)
            )
        if block_m == block_n == 16:
            return found
        halvings += 1


def _choose(kernel: str, hopper: TileConfig, head_dim: int, dtype: torch.dtype, target: Target) -> TileConfig:
    lowering = family_of(target).lowering
    for cfg in candidates(hopper, lowering):
        if fits(kernel, cfg, head_dim, dtype.itemsize, target):
            return cfg
    smallest = candidates(hopper, lowering)[-1]
    need = shared_bytes(kernel, smallest, head_dim, dtype.itemsize, target)
    raise ValueError(
        f"flashattn: no {kernel} tile for head dim {head_dim} ({dtype}) fits compute capability "
        f"{target.capability}: the smallest, {smallest}, needs {need} bytes of shared memory per block and "
        f"the device offers {target.shared_bytes}"
    )


@functools.cache
def configs_for(head_dim: int, dtype: torch.dtype, target: Target = HOPPER) -> KernelConfigs:
    """The tile shapes of every kernel for ``head_dim`` and ``dtype`` on ``target`` (the rule of the module
    docstring); raises ``ValueError`` naming the device's limit if a kernel has no tile that fits."""
    hopper = _CONFIGS[(padded_head_dim(head_dim), dtype.itemsize < 4)]
    chosen = {
        name: _choose(name, getattr(hopper, name), head_dim, dtype, target) for name in ("forward", "dq")
    }
    chosen["dkdv"] = _choose("dkdv" if hopper.dv is None else "dk", hopper.dkdv, head_dim, dtype, target)
    if hopper.dv is not None:
        chosen["dv"] = _choose("dv", hopper.dv, head_dim, dtype, target)
    return KernelConfigs(**chosen)
