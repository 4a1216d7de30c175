"""Applying checkpointing and sharding to the unchanged reference model, and reading it back.

torch FSDP2, in the trainers' order: build on ``meta`` -> wrap recomputed modules (``recomputed``) ->
``fully_shard`` each block (or its wrapper), then the root -> ``to_empty`` on the device ->
``reset_parameters`` (each rank fills only its shard). Our ``parallel.FSDP`` materializes its flat shards
itself. Either way a trainer sees a ``ShardedModel``: the root to call and save, the parameters its
optimizer updates, gradient synchronization and clipping, and the full weights and gradients (fp32, named
as in ``BasicsTransformerLM``: the root's ``lm.`` prefix and the checkpoint wrappers'
``_checkpoint_wrapped_module.`` left out, as in their ``state_dict``).
"""

from __future__ import annotations

from typing import Protocol

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


class ShardedModel(Protocol):
    """What a trainer needs of a sharded root module (collectives: every rank calls them alike)."""

    module: nn.Module  # ``(tokens, targets) -> mean loss``; what a sharded checkpoint saves

    def optimizer_parameters(self) -> list[Tensor]: ...
    def finish_gradient_synchronization(self) -> None: ...
    def clip_grad_norm_(self, max_norm: float) -> Tensor: ...
    def full_parameters(self) -> dict[str, Tensor]: ...
    def full_gradients(self) -> dict[str, Tensor]: ...
    def load_full_parameters(self, state: dict[str, Tensor]) -> None: ...


class Fsdp2Model:
    """A root whose blocks and root ``fully_shard`` made DTensors (see ``shard_fsdp2``)."""

    def __init__(self, root: nn.Module, prefix: str = "lm."):
        self.module, self.prefix = root, prefix

    def optimizer_parameters(self) -> list[Tensor]:
        return list(self.module.parameters())

    def finish_gradient_synchronization(self) -> None:
        """Nothing to wait for: FSDP2 has reduced every gradient when backward returns."""

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        return clip_grad_norm(self.module, max_norm)

    def full_parameters(self) -> dict[str, Tensor]:
        return full_parameters(self.module, self.prefix)

    def full_gradients(self) -> dict[str, Tensor]:
        return full_gradients(self.module, self.prefix)

    def load_full_parameters(self, state: dict[str, Tensor]) -> None:
        load_full_parameters(self.module, state, self.prefix)


class FlatUnitsModel:
    """A root inside our ``parallel.FSDP``: one flat fp32 unit per Transformer block, the rest in the root
    unit, norm gains replicated."""

    def __init__(self, root: nn.Module, compute_dtype: torch.dtype, seed: int, device: torch.device):
        from cs336_basics import TransformerBlock
        from parallel import FSDP

        self.device = device
        self.module = FSDP(root, compute_dtype=compute_dtype, unit_modules=(TransformerBlock,), seed=seed,
                           device=device)  # fmt: skip

    def optimizer_parameters(self) -> list[Tensor]:
        return [*self.module.flat_shards(), *self.module.replicated_parameters()]

    def finish_gradient_synchronization(self) -> None:
        self.module.finish_gradient_synchronization()

    def clip_grad_norm_(self, max_norm: float) -> Tensor:
        """The global norm over every shard and replicated parameter."""
        return self.module.clip_grad_norm_(max_norm)

    def full_parameters(self) -> dict[str, Tensor]:
        return {k.removeprefix("lm."): v for k, v in self.module.gather_full_params(self.device).items()}

    def full_gradients(self) -> dict[str, Tensor]:
        return {k.removeprefix("lm."): v for k, v in self.module.gather_full_grads(self.device).items()}

    def load_full_parameters(self, state: dict[str, Tensor]) -> None:
        self.module.load_state_dict({"lm." + k: v for k, v in state.items()})
