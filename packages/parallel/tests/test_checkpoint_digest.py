"""sum64, the checksum of manifest format 2: equal to a plain-Python reference, the same fed in pieces, and
changed by the damage its docstring says it catches."""

import random
import zlib

import numpy as np
import pytest
from parallel.checkpoint_digest import BLOCK_BYTES, Digest, sum64

MOD = 1 << 64
LENGTHS = [0, 1, 7, 8, 9, 4095, 4096, 4097, 3 * 4096 + 13, 70001]


def reference(data: bytes) -> tuple[int, int]:
    """The definition, in Python integers: word i (little-endian, last zero-padded) of block i // 512
    at column i % 512 weighs (2 * column + 1) in A, and that times (block + 1) in B."""
    padded = bytes(data) + bytes(-len(data) % 8)
    words = [int.from_bytes(padded[i:i + 8], "little") for i in range(0, len(padded), 8)]
    a = sum((2 * (i % 512) + 1) * w for i, w in enumerate(words))
    b = sum((i // 512 + 1) * (2 * (i % 512) + 1) * w for i, w in enumerate(words))
    return a % MOD, b % MOD


def random_bytes(n: int, seed: int = 0) -> bytearray:
    return bytearray(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())


@pytest.mark.parametrize("n", LENGTHS)
def test_sum64_matches_the_reference_whole_and_in_pieces(n):
    data = random_bytes(n, seed=n)
    assert sum64(data) == reference(data)
    digest = Digest("sum64")
    for start in range(0, n, 2 * BLOCK_BYTES):  # pieces at 8 KiB boundaries, the last one short
        digest.update(memoryview(data)[start:start + 2 * BLOCK_BYTES])
    a, b = reference(data)
    assert digest.value == f"{a:016x}{b:016x}"
    assert Digest("crc32").update(data).value == zlib.crc32(data)


def test_every_flipped_byte_and_every_burst_up_to_64_bits_changes_it():
    data = random_bytes(9001, seed=1)
    clean = sum64(data)
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0xFF if position % 2 else 0x01
        assert sum64(damaged) != clean, position
    rng = random.Random(2)
    bits = int.from_bytes(data, "little")
    for _ in range(300):
        length = rng.randint(1, 64)
        start = rng.randrange(len(data) * 8 - length)
        pattern = rng.getrandbits(length) | 1 | (1 << (length - 1))  # first and last bit flipped
        damaged = bytearray((bits ^ (pattern << start)).to_bytes(len(data), "little"))
        assert sum64(damaged) != clean, (start, length)


def test_swapped_blocks_and_words_change_it():
    data = random_bytes(5 * BLOCK_BYTES + 100, seed=3)
    clean = sum64(data)
    swapped = bytearray(data)
    swapped[:BLOCK_BYTES], swapped[3 * BLOCK_BYTES:4 * BLOCK_BYTES] = (data[3 * BLOCK_BYTES:4 * BLOCK_BYTES],
                                                                      data[:BLOCK_BYTES])
    assert sum64(swapped) != clean
    swapped = bytearray(data)
    swapped[8:16], swapped[800:808] = data[800:808], data[8:16]
    assert sum64(swapped) != clean


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="start must be a multiple of 4096 bytes, got 100"):
        sum64(bytearray(16), 100)
    with pytest.raises(ValueError, match=r"algorithm must be one of \('crc32', 'sum64'\), got 'md5'"):
        Digest("md5")
