"""Training checkpoints: model, optimizer and iteration, written atomically."""

from __future__ import annotations

import os
import tempfile
from typing import IO, BinaryIO

import torch


def save_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    iteration: int,
    out: str | os.PathLike | BinaryIO | IO[bytes],
) -> None:
    """Write model and optimizer state and ``iteration`` to ``out``.

    A path is written to a temporary file in the same folder and renamed, so a crash
    never leaves a truncated checkpoint behind.
    """
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}
    if not isinstance(out, (str, os.PathLike)):
        torch.save(state, out)
        return
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ckpt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def load_checkpoint(
    src: str | os.PathLike | BinaryIO | IO[bytes], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> int:
    """Restore model and optimizer from ``src``; returns the saved iteration."""
    state = torch.load(src, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["iteration"])
