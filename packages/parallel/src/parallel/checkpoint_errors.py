"""What ``load_sharded`` raises when a checkpoint does not fit, is damaged, or carries code."""

from __future__ import annotations

__all__ = ["CheckpointError", "CorruptCheckpointError", "UnsafeCheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint that does not match the model or optimizer it is loaded into (the message names the key,
    the expected and the found value); the base of the two errors below."""


class CorruptCheckpointError(CheckpointError):
    """Bytes that differ from those written: a failed checksum, a truncated, missing or unreadable file (the
    message names the file and, where known, the key)."""


class UnsafeCheckpointError(CheckpointError):
    """A pickled piece that names a function or class outside the allow-list; refused without running it."""
