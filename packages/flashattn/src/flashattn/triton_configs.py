"""Tile shapes of the Triton kernels: one :class:`KernelConfigs` per (padded head dim, 16-bit or fp32).

Head dims run in the next power-of-two tile (80 and 96 in 128, 192 in 256). The (128, 16-bit) entry won every
candidate list of ``python -m flashattn.tune`` on an H200 at (1, 32, 16384, 128); the fp32 entries for 128 and
64 won ``flashattn.tune --dtype fp32 --seq 4096`` (tf32x3 dots, 3-40x faster than the best IEEE tiles); the
others follow the same reasoning. The (256, 16-bit) entry won ``flashattn.tune --head-dim 256 --seq 8192
--heads 16`` on an H200 (forward 128 queries by 64 keys, 8 warps; dK/dV 64 keys against 64-query steps, 8
warps; two stages each, to fit shared memory, :func:`shared_bytes` against :data:`SHARED_MEMORY_BYTES`), and
its dK and dV run as separate programs (``dv`` set): ``flashattn.tune --head-dim 256 --seq 8192 --heads 16
--kernels dkdv dk dv`` timed dK alone on 128 keys against 32-query steps at 2.08 ms and dV alone on 128 keys
against 64-query steps at 1.37 ms, 1.36x faster together than the best fused dK/dV (64 x 64, 4.68 ms). Its dQ
(128 queries against 32-key steps, 8 warps, three stages) won ``--kernels forward dq dk dv --all``: 1.55 ms,
against 1.85 for the best shape of 64 queries (four stages) and 2.84 for the earlier two-stage one. The fp32
entry at 256 is half the forward and dQ tiles, unpipelined, by the same reasoning. No other entry sets ``dv``:
at 128 and below the fused kernel's registers fit.
"""

from contextlib import AbstractContextManager
from typing import NamedTuple

from flashattn.pinning import Pin

SHARED_MEMORY_BYTES = 227 * 1024  # one Hopper thread block's opt-in maximum
X3 = "tf32x3"


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
_pin: Pin[KernelConfigs] = Pin()


def padded_head_dim(head_dim: int) -> int:
    """The power-of-two tile width a head dim runs in (at least 16)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def configs_for(head_dim: int, dtype) -> KernelConfigs:
    """The tile table's entry for ``head_dim`` and ``dtype``, or the one pinned by :func:`pinned_configs`."""
    if _pin.value is not None:
        return _pin.value
    return _CONFIGS[(padded_head_dim(head_dim), dtype.itemsize < 4)]  # fp16 / bf16, or fp32


def table() -> dict[tuple[int, bool], KernelConfigs]:
    """A copy of the tile table, keyed by (padded head dim, 16-bit?)."""
    return dict(_CONFIGS)


def shared_bytes(kernel: str, cfg: TileConfig, head_dim: int, itemsize: int) -> int:
    """Shared memory of a kernel's pipelined tiles: the tile it keeps plus ``num_stages`` of what it streams.

    Forward keeps ``q`` and streams ``k, v``; dQ keeps ``q, dO`` and streams ``k, v``; dK/dV (and dK alone)
    keeps ``k, v`` and streams ``q, dO``; dV alone keeps ``k``. The probability (or ``dS``) tile of the second
    product stays in registers: on an H200, of the 52 head-dim-256 shapes of ``flashattn.tune --all``, those
    this count puts within :data:`SHARED_MEMORY_BYTES` compiled and ran, and the others did not.
    """
    d = padded_head_dim(head_dim)
    kept, streamed = {"forward": (1, 2), "dq": (2, 2), "dkdv": (2, 2), "dk": (2, 2), "dv": (1, 2)}[kernel]
    own, other = (cfg.block_n, cfg.block_m) if kernel in ("dkdv", "dk", "dv") else (cfg.block_m, cfg.block_n)
    return (kept * own + cfg.num_stages * streamed * other) * d * itemsize


def pinned_configs(configs: KernelConfigs) -> AbstractContextManager[None]:
    """Use ``configs`` for every launch inside the ``with`` block (tests pin one, to be reproducible)."""
    return _pin.pinned(configs)
