"""Applying checkpointing and torch FSDP2 to the unchanged reference model, and reading it back.

Order, as in the trainers: build on ``meta`` -> ``fully_shard`` each block, then the root ->
``to_empty`` on the device -> ``reset_parameters`` (each rank fills only its shard). Checkpointing and
compilation replace only instance ``forward`` attributes, so they can come before or after sharding.
Parameter names stay those of ``BasicsTransformerLM`` under the root's prefix (``lm.``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint


def checkpoint_forward(module: nn.Module) -> None:
    """Recompute ``module``'s forward in backward instead of keeping its activations.

    Wraps the instance's current ``forward`` (a compiled one too) in a non-reentrant checkpoint; the
    module itself is not replaced, so names, hooks and FSDP units are unchanged.
    """
    module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)


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
    return {n.removeprefix(prefix): _full(p.detach()).float() for n, p in module.named_parameters()}


def full_gradients(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """Every gradient gathered to a full fp32 tensor, keyed by parameter name without ``prefix``."""
    return {n.removeprefix(prefix): _full(p.grad).float() for n, p in module.named_parameters()}


@torch.no_grad()
def load_full_parameters(module: nn.Module, state: dict[str, Tensor], prefix: str = "") -> None:
    """Copy full tensors (names without ``prefix``) into ``module``'s possibly sharded parameters."""
    for name, param in module.named_parameters():
        full = state[name.removeprefix(prefix)].to(param.device, param.dtype)
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
        else:
            param.copy_(full)


def fsdp2_accessors(root: nn.Module, prefix: str = "lm."):
    """``(full_parameters, full_gradients, load_parameters)`` callables of a trainer over ``root``."""
    return (
        functools.partial(full_parameters, root, prefix),
        functools.partial(full_gradients, root, prefix),
        functools.partial(load_full_parameters, root, prefix=prefix),
    )
