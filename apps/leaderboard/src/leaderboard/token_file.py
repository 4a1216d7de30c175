"""Token files: flat arrays of uint16 token ids, checked before a run and read during it.

``check_tokens`` refuses, naming the option, a path that is missing, a folder, of an odd size, too short
for the context, or holding an id outside the vocabulary. ``TokenFile`` reads windows with positioned reads
(``os.pread``): a file cut short while a run reads it (``np.memmap`` would kill the rank with SIGBUS) is
named in a ``RuntimeError`` instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def check_tokens(path: Path, option: str, vocab_size: int, context_length: int) -> None:
    """ValueError naming ``option`` unless ``path`` holds more than ``context_length + 1`` uint16 ids below
    ``vocab_size``."""
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder, expected a token file")
    if not path.exists():
        raise ValueError(f"{option} {path}: no such file")
    if not path.is_file():
        raise ValueError(f"{option} {path}: not a regular file (a pipe or device), expected a token file")
    size = path.stat().st_size
    if size % 2:
        raise ValueError(f"{option} {path}: {size} bytes is not a whole number of uint16 token ids")
    if size // 2 <= context_length + 1:
        raise ValueError(
            f"{option} {path}: {size // 2} tokens, need more than context_length + 1 = {context_length + 1}"
        )
    largest = int(np.memmap(path, dtype=np.uint16, mode="r").max())
    if largest >= vocab_size:
        raise ValueError(
            f"{option} {path}: token id {largest} is outside the model's vocabulary of {vocab_size}"
        )


class TokenFile:
    """A 1-D uint16 token array on disk, sliced like ``np.memmap`` (``len``, ``[start:stop]``, ``dtype``,
    ``ndim``), as ``cs336_basics.get_batch`` takes it; ``option`` names it in errors."""

    ndim = 1
    dtype = np.dtype(np.uint16)

    def __init__(self, path: Path, option: str):
        self.path, self.option = Path(path), option
        self._fd = os.open(self.path, os.O_RDONLY)
        self._bytes = os.fstat(self._fd).st_size

    def __len__(self) -> int:
        return self._bytes // 2

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(f"TokenFile takes contiguous slices [start:stop], got {index!r}")
        start, stop, _ = index.indices(len(self))
        want = 2 * max(0, stop - start)
        data = os.pread(self._fd, want, 2 * start)
        if len(data) != want:
            now = os.fstat(self._fd).st_size
            raise RuntimeError(
                f"{self.option} {self.path}: the file shrank from {self._bytes} to {now} bytes during the "
                f"run (tokens {start}-{stop} asked for); restore it and resume from the last checkpoint"
            )
        return np.frombuffer(data, dtype=np.uint16)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> TokenFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
