"""Training checkpoints: model, optimizer and iteration, written atomically."""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import IO, BinaryIO

import torch


def _temp_prefix(target: Path) -> str:
    """Hidden name prefix of ``target``'s temporary files: ``.<name>.`` in the same folder."""
    return f".{target.name}."


def _remove_stale_temps(target: Path) -> None:
    """Delete temporaries a killed earlier save of ``target`` left behind (one writer per path at a time)."""
    for stale in target.parent.glob(f"{_temp_prefix(target)}*.tmp"):
        stale.unlink(missing_ok=True)


def save_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    iteration: int,
    out: str | os.PathLike | BinaryIO | IO[bytes],
) -> None:
    """Write model and optimizer state and ``iteration`` to ``out``.

    A path is written to a hidden temporary file ``.<name>.<random>.tmp`` in the same folder and renamed,
    so a crash never leaves a truncated checkpoint behind. The temporary is removed when the save fails; one
    left by a killed process is removed by the next save to the same path.
    """
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}
    if not isinstance(out, (str, os.PathLike)):
        torch.save(state, out)
        return
    target = Path(out).absolute()
    _remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def load_checkpoint(
    src: str | os.PathLike | BinaryIO | IO[bytes], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> int:
    """Restore model and optimizer from ``src``; returns the saved iteration.

    An empty, truncated or foreign file raises ``ValueError`` naming it.
    """
    name = os.fspath(src) if isinstance(src, (str, os.PathLike)) else getattr(src, "name", repr(src))
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        size = f"{os.path.getsize(src)} bytes, " if isinstance(src, (str, os.PathLike)) else ""
        reason = str(error).split(". ")[0] or type(error).__name__
        message = f"{name} is not a complete checkpoint ({size}empty or truncated?): {reason}"
        raise ValueError(message) from error
    missing = {"model", "optimizer", "iteration"} - set(state if isinstance(state, dict) else ())
    if missing:
        raise ValueError(f"{name} is not a training checkpoint: it lacks {sorted(missing)}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["iteration"])
