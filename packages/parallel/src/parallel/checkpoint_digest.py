"""Checksums of a checkpoint's stored items: ``sum64`` (written since manifest format 2), computed by torch in
one read of the bytes, and zlib's CRC-32 (format 1, still read).

sum64 of a byte string: its bytes as little-endian 64-bit words ``w[j, c]`` (the last one zero-padded), in
blocks ``j`` of 512 words (4 KiB) at columns ``c``; ``S_j = sum_c (2c + 1) * w[j, c]``, ``A = sum_j S_j``
and ``B = sum_j (j + 1) * S_j``, both mod 2^64, written as 32 hex digits. ``S`` is one ``torch.mv`` of the
blocks by the odd weights: torch's integer mv is a single loop (no intra-op threads to contend with), about
10-15 GB/s on one core, where zlib's CRC-32 runs at 2-4 GB/s.

What it catches (the item's length is compared separately, so truncation is always caught):
- any change to a set of bits whose positions mod 64 are distinct (each changes ``A`` by an odd multiple of
  a distinct power of two, so the sum is never 0 mod 2^64): every flipped byte, every burst of up to 64
  flipped bits, any damage within one aligned 8-byte word;
- two different words swapped within a block, unless they differ only in their top 10 bits (``A`` changes
  by ``2 (c - c') (w - w')``); two blocks swapped or moved, unless ``(j - j') (S_j - S_j')`` is 0 mod 2^64;
- other damage (a region overwritten, a block of another file) unless it leaves both sums unchanged.
What it misses: changes that cancel in both sums, e.g. ``+3d`` in column 0 and ``-d`` in column 1 of one
block. CRC-32 catches every burst of up to 32 bits. Neither defends against a crafted checkpoint (a forged
manifest matches forged bytes).
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["ALGORITHMS", "BLOCK_BYTES", "Digest", "sum64"]

BLOCK_BYTES = 4096
_BLOCK_WORDS = BLOCK_BYTES // 8
_MOD = 1 << 64
ALGORITHMS = ("crc32", "sum64")


def sum64(data: bytearray | memoryview, start: int = 0) -> tuple[int, int]:
    """``(A, B)`` of ``data`` read as the bytes at ``start`` (a multiple of ``BLOCK_BYTES``) of a longer
    item: the pieces' sums add up (mod 2^64) to the whole item's. ``data`` must be writable (torch warns
    of a tensor over read-only memory)."""
    if start % BLOCK_BYTES:
        raise ValueError(f"start must be a multiple of {BLOCK_BYTES} bytes, got {start}")
    n_words = len(data) // 8
    full = n_words - n_words % _BLOCK_WORDS
    words = torch.zeros(0, dtype=torch.int64)
    if n_words:
        words = torch.frombuffer(data, dtype=torch.int64, count=n_words)
    column_weights = torch.arange(1, 2 * _BLOCK_WORDS, 2, dtype=torch.int64)  # 2c + 1
    # torch's integer mv and dot are single loops (no intra-op threads, whose start costs more than the
    # sums when other processes hold the cores); int64 wraps around, giving the sums mod 2^64
    block_sums = torch.mv(words[:full].view(-1, _BLOCK_WORDS), column_weights)
    tail = int.from_bytes(bytes(data[8 * n_words:]), "little")  # the last 0-7 bytes, zero-padded
    partial = n_words - full
    last = int(torch.dot(words[full:], column_weights[:partial])) + (2 * partial + 1) * tail
    first = start // BLOCK_BYTES + 1
    n_blocks = block_sums.numel()
    block_weights = torch.arange(first, first + n_blocks, dtype=torch.int64)
    ones = torch.ones(1, dtype=torch.int64).expand(n_blocks)
    a = int(torch.dot(block_sums, ones)) + last
    b = int(torch.dot(block_sums, block_weights)) + (first + n_blocks) * last
    return a % _MOD, b % _MOD


class Digest:
    """Running checksum of one item, fed in order by :meth:`update` (for ``sum64`` every piece but the last
    a multiple of ``BLOCK_BYTES`` long); :attr:`value` is what the manifest stores: an int (CRC-32) or 32
    hex digits (sum64)."""

    def __init__(self, algorithm: str):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        self.algorithm = algorithm
        self._crc, self._a, self._b, self._length = 0, 0, 0, 0

    def update(self, data: bytearray | memoryview) -> Digest:
        if self.algorithm == "crc32":
            self._crc = zlib.crc32(data, self._crc)
        else:
            a, b = sum64(data, self._length)
            self._a, self._b = (self._a + a) % _MOD, (self._b + b) % _MOD
        self._length += len(data)
        return self

    @property
    def value(self) -> int | str:
        return self._crc if self.algorithm == "crc32" else f"{self._a:016x}{self._b:016x}"
