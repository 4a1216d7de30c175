"""Random language-model batches from a token array."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch


def get_batch(
    dataset: npt.NDArray, batch_size: int, context_length: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` windows from a 1-D token array: an ``np.ndarray``, an ``np.memmap`` or any object
    with ``ndim``, an integer ``dtype``, ``len`` and ``[start:stop]`` slices (e.g. a reader that names a file
    cut short instead of faulting as a memmap would).

    Returns inputs and next-token targets, both ``(batch_size, context_length)`` int64 on ``device``.
    """
    if dataset.ndim != 1:
        raise ValueError(f"dataset must be a 1-D token array, got shape {dataset.shape}")
    if not np.issubdtype(dataset.dtype, np.integer):
        raise TypeError(f"dataset must hold integer token ids, got dtype {dataset.dtype}")
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"batch_size and context_length must be >= 1, got {batch_size} and {context_length}")
    if len(dataset) <= context_length:
        raise ValueError(f"dataset of {len(dataset)} tokens is too short for context_length {context_length}")
    starts = np.random.randint(0, len(dataset) - context_length, size=batch_size)
    windows = np.stack([np.asarray(dataset[s : s + context_length + 1], dtype=np.int64) for s in starts])
    batch = torch.from_numpy(windows).to(device)
    return batch[:, :-1], batch[:, 1:]
