"""Fail fast when ranks build different models: one small all-gather of a fingerprint before any other
collective, instead of a hang (or "Connection reset by peer") in the first mismatched broadcast."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["all_ranks_ok", "check_same_model"]

Description = list[tuple[str, tuple[int, ...], str]]


def describe(model: nn.Module | Iterable[Tensor]) -> Description:
    """``(name, shape, dtype)`` of each parameter and buffer of a module, or of a list of tensors by index."""
    if isinstance(model, nn.Module):
        named = [(f"parameter {n}", t) for n, t in model.named_parameters()]
        named += [(f"buffer {n}", t) for n, t in model.named_buffers()]
    else:
        named = [(f"parameter {i}", t) for i, t in enumerate(model)]
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named]


def _fingerprint(description: Description) -> tuple[int, int]:
    digest = hashlib.blake2b(repr(description).encode(), digest_size=8).digest()
    return len(description), int.from_bytes(digest, "little", signed=True)


def _first_difference(mine: Description, theirs: Description) -> str:
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a != b:
            return f"entry {i}: {a[0]} {list(a[1])} {a[2]} vs {b[0]} {list(b[1])} {b[2]}"
    longer, extra = (mine, "rank 0") if len(mine) > len(theirs) else (theirs, "the other rank")
    shorter = min(len(mine), len(theirs))
    return f"{extra} has more entries, first extra: {longer[shorter][0]}"


def check_not_wrapped(module: nn.Module, who: str) -> None:
    """``ValueError`` if ``module`` or one of its submodules is already a wrapper of this package (a class
    with ``wraps_for_parallel = True``): wrapped twice, each would synchronize the gradients."""
    inner = next(((name, m) for name, m in module.named_modules() if getattr(m, "wraps_for_parallel", False)),
                 None)  # fmt: skip
    if inner is not None:
        where = f"its submodule {inner[0]!r}" if inner[0] else "the module"
        raise ValueError(f"{who}: {where} is already a {type(inner[1]).__name__}; wrap the plain model once")


def check_same_model(model: nn.Module | Iterable[Tensor], who: str,
                     device: torch.device | None = None) -> None:
    """Raise ``ValueError`` on every rank unless all ranks hold the same parameter (and buffer) names, shapes
    and dtypes, in the same order; the message names the first rank that differs from rank 0 and the first
    differing entry. One all-gather of 16 bytes per rank when they agree (collective: call on every rank).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    description = describe(model)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else \
            torch.device("cpu")
    local = torch.tensor(_fingerprint(description), dtype=torch.int64, device=device)
    gathered = torch.empty(dist.get_world_size() * 2, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(gathered, local)
    prints = gathered.view(-1, 2).tolist()
    if all(p == prints[0] for p in prints):
        return
    descriptions: list[Description] = [None] * dist.get_world_size()
    dist.all_gather_object(descriptions, description)
    other = next(r for r, p in enumerate(prints) if p != prints[0])
    counts = ", ".join(f"rank {r}: {len(d)}" for r, d in enumerate(descriptions))
    raise ValueError(
        f"{who}: ranks hold different models (parameters and buffers per rank: {counts}); rank 0 vs rank "
        f"{other}, first difference at {_first_difference(descriptions[0], descriptions[other])}")


def all_ranks_ok(ok: bool) -> bool:
    """True on every rank if ``ok`` is true on every rank (one small all-reduce; collective), so that a
    failure on one rank makes all fail together instead of leaving the others waiting for it."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor(int(ok), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
