"""What every training step offers the benchmark loop and the equivalence check.

A ``Trainer`` holds a sharded model (``root``: what a sharded checkpoint saves) and its optimizer.
``forward_backward(tokens, targets)`` returns the local mean loss (gradients reduced across ranks when it
returns); ``clip_grad_norm(max_norm)`` scales the gradients to that global L2 norm and returns the norm
before clipping; ``optimizer_step()`` updates the weights and clears the gradients.
``full_parameters()`` / ``full_gradients()`` gather them whole
(fp32, keyed by the reference model's parameter names; collectives: every rank calls them) and
``load_parameters(state)`` sets the weights from such a dict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


@dataclass
class Trainer:
    name: str
    root: nn.Module
    optimizer: torch.optim.Optimizer
    forward_backward: Callable[[Tensor, Tensor], Tensor]
    optimizer_step: Callable[[], None]
    clip_grad_norm: Callable[[float], Tensor]
    full_parameters: Callable[[], dict[str, Tensor]]
    full_gradients: Callable[[], dict[str, Tensor]]
    load_parameters: Callable[[dict[str, Tensor]], None]
    info: dict = field(default_factory=dict)

    def step(self, tokens: Tensor, targets: Tensor) -> Tensor:
        loss = self.forward_backward(tokens, targets)
        self.optimizer_step()
        return loss


def random_batch(
    vocab_size: int, batch: int, seq: int, seed: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Token ids and next-token targets ``(batch, seq)``, uniform over the vocabulary, fixed by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq + 1), generator=generator)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)
