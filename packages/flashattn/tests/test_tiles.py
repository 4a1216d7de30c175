"""The tile rule of flashattn.portable.tiles: every chosen tile fits every target by the estimate, the
Hopper table is kept on sm_90, and a device without room gets an error naming its limit."""

import pytest
import torch
from flashattn.portable import tiles

TARGETS = (80, 86, 89, 90, 100, 120)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _kernels(configs: tiles.KernelConfigs) -> list[tuple[str, tiles.TileConfig]]:
    split = configs.dv is not None
    named = [("forward", configs.forward), ("dk" if split else "dkdv", configs.dkdv), ("dq", configs.dq)]
    return named + ([("dv", configs.dv)] if split else [])


@pytest.mark.parametrize("sm", TARGETS)
def test_every_chosen_tile_fits_its_target(sm: int) -> None:
    target = tiles.family_target(sm)
    tmem = tiles.family_of(target).tmem_columns
    for head_dim in range(16, 257, 8):
        for dtype in DTYPES:
            for kernel, cfg in _kernels(tiles.configs_for(head_dim, dtype, target)):
                need = tiles.shared_bytes(kernel, cfg, head_dim, dtype.itemsize, target)
                assert need <= target.shared_bytes, (sm, head_dim, dtype, kernel, cfg, need)
                assert tiles.tmem_columns(kernel, cfg, head_dim, dtype.itemsize, target) <= tmem
                assert min(cfg.block_m, cfg.block_n) >= 16 and cfg.num_warps in (4, 8)


def test_hopper_keeps_its_measured_table() -> None:
    for (head_dim, half), expected in tiles.table().items():
        for dtype in (torch.bfloat16, torch.float16) if half else (torch.float32,):
            assert tiles.configs_for(head_dim, dtype, tiles.family_target(90)) == expected


def test_families_and_limits() -> None:
    assert tiles.family_target(89) == tiles.Target((8, 9), 99 * 1024)
    assert tiles.family_target(80).shared_bytes == 163 * 1024
    assert tiles.family_of(tiles.Target((10, 3), 0)).lowering == "tcgen05"  # a newer part runs as its family
    assert tiles.family_of(tiles.Target((12, 1), 0)).lowering == "mma"
    with pytest.raises(ValueError, match=r"8\.0 or newer"):
        tiles.family_of(tiles.Target((7, 5), 65536))


def test_smaller_devices_get_smaller_tiles_and_the_rule_is_monotone() -> None:
    # Less shared memory never gives a larger tile, and a device with the room of an H100 gets Hopper's.
    for head_dim in (40, 128, 200, 256):
        for dtype in DTYPES:
            big = tiles.configs_for(head_dim, dtype, tiles.Target((8, 9), 227 * 1024))
            small = tiles.configs_for(head_dim, dtype, tiles.family_target(89))
            for (_, b), (_, s) in zip(_kernels(big), _kernels(small), strict=True):
                assert s.block_m * s.block_n <= b.block_m * b.block_n


def test_no_room_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"offers 8192"):
        tiles.configs_for(256, torch.float32, tiles.Target((8, 9), 8192))
