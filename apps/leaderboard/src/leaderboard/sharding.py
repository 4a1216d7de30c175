"""Applying checkpointing and torch FSDP2 to the unchanged reference model, and reading it back.

Order, as in the trainers: build on ``meta`` -> wrap recomputed modules (``recomputed``) -> ``fully_shard``
each block (or its wrapper), then the root -> ``to_empty`` on the device -> ``reset_parameters`` (each rank
fills only its shard). Parameter names are those of ``BasicsTransformerLM`` under the root's prefix (``lm.``),
with the checkpoint wrappers' ``_checkpoint_wrapped_module.`` left out (as in their ``state_dict``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


def recomputed(module: nn.Module) -> nn.Module:
    """``module`` inside torch's checkpoint wrapper: backward recomputes its forward (a compiled one too,
    non-reentrant) instead of keeping its activations. Put it where ``module`` was."""
    return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def plain_name(name: str, prefix: str = "") -> str:
    """A parameter name without ``prefix`` and without the checkpoint wrappers' part."""
    return name.removeprefix(prefix).replace(_CHECKPOINT_PREFIX, "")


def shard_fsdp2(root: nn.Module, blocks: list[nn.Module], compute_dtype: torch.dtype | None) -> None:
    """``fully_shard`` each block and then ``root``; params in ``compute_dtype``, fp32 gradient reduction."""
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(root, mp_policy=policy)


def materialize(root: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate the (sharded) parameters of a meta-built ``root`` on ``device`` and initialize them."""
    root.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in root.modules():
            if module is not root and hasattr(module, "reset_parameters") and not list(module.children()):
                module.reset_parameters()


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_parameters(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """Every parameter gathered to a full fp32 tensor, keyed by name without ``prefix``."""
    return {plain_name(n, prefix): _full(p.detach()).float() for n, p in module.named_parameters()}


def full_gradients(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """Every gradient gathered to a full fp32 tensor, keyed by parameter name without ``prefix``."""
    return {plain_name(n, prefix): _full(p.grad).float() for n, p in module.named_parameters()}


@torch.no_grad()
def load_full_parameters(module: nn.Module, state: dict[str, Tensor], prefix: str = "") -> None:
    """Copy full tensors (names without ``prefix``) into ``module``'s possibly sharded parameters."""
    for name, param in module.named_parameters():
        full = state[plain_name(name, prefix)].to(param.device, param.dtype)
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
        else:
            param.copy_(full)


def clip_grad_norm(root: nn.Module, max_norm: float) -> Tensor:
    """Scale the gradients of ``root`` (sharded by FSDP2 or not) to a global L2 norm of at most
    ``max_norm``; returns the norm before clipping (a plain tensor, the same on every rank)."""
    norm = torch.nn.utils.clip_grad_norm_(root.parameters(), max_norm)
    return _full(norm)


def fsdp2_shard_bytes(root: nn.Module, world_size: int) -> int:
    """Bytes of one rank's fp32 shards once ``fully_shard`` splits every parameter's dim 0 (padded)."""
    return sum(4 * -(-p.shape[0] // world_size) * (p.numel() // p.shape[0]) for p in root.parameters())


def fsdp2_accessors(root: nn.Module, prefix: str = "lm."):
    """``(full_parameters, full_gradients, load_parameters)`` callables of a trainer over ``root``."""
    return (
        functools.partial(full_parameters, root, prefix),
        functools.partial(full_gradients, root, prefix),
        functools.partial(load_full_parameters, root, prefix=prefix),
    )
