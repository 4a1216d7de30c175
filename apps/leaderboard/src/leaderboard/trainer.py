"""The trainer every mode runs: a sharded model, its optimizer and what one rank does with them.

``step`` is the benchmark's timed step (forward, loss, backward with gradients reduced across ranks, AdamW,
gradients cleared); ``training_step`` is the training loop's (the same, with the global gradient norm
clipped, and no update when the loss or the norm is not finite); ``evaluate`` is a loss without gradients;
``save`` / ``load`` write and read sharded checkpoints (``parallel.checkpoint``, every rank its shards and
optimizer state). ``full_parameters`` / ``full_gradients`` gather them whole (fp32, keyed by the reference
model's parameter names) and ``load_parameters`` sets the weights from such a dict. Every method is a
collective: all ranks call it alike.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from cs336_basics import ModelConfig
from torch import Tensor, nn

from .ranks import mean_over_ranks
from .sharding import ShardedModel


class Trainer:
    def __init__(
        self,
        name: str,
        config: ModelConfig,
        sharded: ShardedModel,
        optimizer: torch.optim.Optimizer,
        info: dict,
    ):
        self.name, self.config, self.sharded, self.optimizer, self.info = (
            name,
            config,
            sharded,
            optimizer,
            info,
        )

    @property
    def root(self) -> nn.Module:
        """The sharded root module (what a checkpoint saves)."""
        return self.sharded.module

    def forward_backward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """This rank's mean loss on ``(batch, seq)`` token ids; the gradients are reduced when it returns."""
        loss = self.root(tokens, targets)
        loss.backward()
        self.sharded.finish_gradient_synchronization()
        return loss.detach()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """One training step as the benchmark times it; this rank's loss."""
        loss = self.forward_backward(tokens, targets)
        self.optimizer_step()
        return loss

    def training_step(
        self, tokens: Tensor, targets: Tensor, max_grad_norm: float
    ) -> tuple[float, float, bool]:
        """``(loss, grad_norm, applied)``: the mean loss over ranks and the global gradient norm before
        clipping to ``max_grad_norm``; the step is applied only when both are finite (else the gradients
        are dropped)."""
        loss = mean_over_ranks(self.forward_backward(tokens, targets))
        norm = float(self.sharded.clip_grad_norm_(max_grad_norm))
        applied = math.isfinite(loss) and math.isfinite(norm)  # the same on every rank: both are global
        if applied:
            self.optimizer_step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return loss, norm, applied

    @torch.no_grad()
    def evaluate(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """This rank's mean loss without gradients."""
        return self.root(tokens, targets)

    def save(self, path: Path, extra: dict) -> None:
        from parallel.checkpoint import save_sharded

        save_sharded(path, self.root, self.optimizer, extra=extra)

    def load(self, path: Path) -> dict:
        """Weights and optimizer state from ``path``; returns what ``save`` was given as ``extra``."""
        from parallel.checkpoint import load_sharded

        return load_sharded(path, self.root, self.optimizer)

    def full_parameters(self) -> dict[str, Tensor]:
        return self.sharded.full_parameters()

    def full_gradients(self) -> dict[str, Tensor]:
        return self.sharded.full_gradients()

    def load_parameters(self, state: dict[str, Tensor]) -> None:
        self.sharded.load_full_parameters(state)
