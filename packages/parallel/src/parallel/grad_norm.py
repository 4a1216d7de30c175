"""Gradient-norm clipping over gradients that are sharded across ranks, replicated, or both."""

from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["check_clip_arguments", "clip_replicated_", "clip_sharded_"]


def check_clip_arguments(max_norm: float, norm_type: float) -> tuple[float, float]:
    """``(max_norm, norm_type)`` as floats; refuses a negative or non-finite ``max_norm`` and a ``norm_type``
    that is not positive (``inf`` allowed)."""
    for name, value in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {value!r}")
    if not (math.isfinite(max_norm) and max_norm >= 0):
        raise ValueError(f"max_norm must be a finite number >= 0, got {max_norm!r}")
    if not norm_type > 0:
        raise ValueError(f"norm_type must be > 0 (or inf), got {norm_type!r}")
    return float(max_norm), float(norm_type)


def _local_power(grads: list[Tensor], norm_type: float, device: torch.device) -> Tensor:
    """``sum |g|^p`` over ``grads`` (``max |g|`` for the inf-norm), a float64 scalar on ``device``."""
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch.stack([torch.linalg.vector_norm(g, norm_type).to(torch.float64) for g in grads]).to(device)
    return norms.max() if math.isinf(norm_type) else norms.pow(norm_type).sum()


def _scale_(grads: list[Tensor], max_norm: float, total: Tensor) -> None:
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(device=g.device, dtype=g.dtype))


@torch.no_grad()
def clip_sharded_(sharded: list[Tensor], replicated: list[Tensor], max_norm: float, norm_type: float = 2.0,
                  device: torch.device | str | None = None) -> Tensor:
    """Clip gradients of which this rank holds ``sharded`` (a disjoint slice of the whole, every element held
    by exactly one rank) and ``replicated`` (the same on every rank) to a global norm of ``max_norm``.

    One all-reduce of a float64 scalar (collective: call on every rank); returns the norm before clipping.
    """
    max_norm, norm_type = check_clip_arguments(max_norm, norm_type)
    if device is None:
        device = (sharded or replicated)[0].device if (sharded or replicated) else torch.device("cpu")
    part = _local_power(sharded, norm_type, device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(part, op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM)
    rest = _local_power(replicated, norm_type, device)
    total = torch.maximum(part, rest) if math.isinf(norm_type) else (part + rest).pow(1.0 / norm_type)
    _scale_(sharded + replicated, max_norm, total)
    return total


@torch.no_grad()
def clip_replicated_(grads: list[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Clip gradients that are equal on every rank (no communication); returns the norm before clipping."""
    max_norm, norm_type = check_clip_arguments(max_norm, norm_type)
    device = grads[0].device if grads else torch.device("cpu")
    power = _local_power(grads, norm_type, device)
    total = power if math.isinf(norm_type) else power.pow(1.0 / norm_type)
    _scale_(grads, max_norm, total)
    return total
