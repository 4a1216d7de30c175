"""Progress lines for long runs: one line per item with its index, the elapsed time and an estimate left."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], what: str, describe=str, stream=None) -> Iterator[T]:
    """Yield ``items``, printing ``[i/n] what: describe(item) (elapsed, left)`` before each, flushed."""
    items = list(items)
    stream = stream or sys.stderr
    start = time.perf_counter()
    for i, item in enumerate(items):
        elapsed = time.perf_counter() - start
        left = f", ~{elapsed / i * (len(items) - i):.0f} s left" if i else ""
        print(f"[{i + 1}/{len(items)}] {what}: {describe(item)} ({elapsed:.0f} s{left})", file=stream,
              flush=True)  # fmt: skip
        yield item
