"""Values agreed over the ranks of the process group; the benchmark's global batch and each rank's rows."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def max_over_ranks(value: float, device: torch.device) -> float:
    """The largest ``value`` of any rank (a collective: every rank calls it)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: Tensor) -> float:
    """The mean of a one-element tensor over the ranks (a collective)."""
    t = value.detach().double().reshape(1)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def rank_rows(batch: int, rank: int, world_size: int) -> slice:
    """This rank's rows of a global batch of ``batch`` sequences (the same batch on any number of ranks)."""
    per_rank = batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def random_batch(
    vocab_size: int, batch: int, seq: int, seed: int, device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """Token ids and next-token targets ``(batch, seq)``, uniform over the vocabulary, fixed by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq + 1), generator=generator)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)
