"""A module-level choice that a ``with`` block can override: the tile tables and the kernel choice use it."""

import contextlib
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Pin(Generic[T]):
    """``value`` is ``None`` (the normal choice applies) or what the innermost :meth:`pinned` block set."""

    def __init__(self) -> None:
        self.value: T | None = None

    @contextlib.contextmanager
    def pinned(self, value: T) -> Iterator[None]:
        previous, self.value = self.value, value
        try:
            yield
        finally:
            self.value = previous
