"""AdamW with decoupled weight decay and bias correction, and the cosine learning-rate schedule.

The update follows ``torch.optim.AdamW`` step for step:
    p <- p * (1 - lr * weight_decay)
    m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor


class AdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        if lr < 0:
            raise ValueError(f"invalid learning rate lr={lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"invalid eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            # All parameters of a group share the step count unless groups were edited mid-training;
            # update per step count so the bias corrections stay exact.
            by_step: dict[int, list[Tensor]] = {}
            for p in params:
                by_step.setdefault(self.state[p]["step"], []).append(p)
            for step, ps in by_step.items():
                grads = [p.grad for p in ps]
                m = [self.state[p]["exp_avg"] for p in ps]
                v = [self.state[p]["exp_avg_sq"] for p in ps]
                if wd:
                    torch._foreach_mul_(ps, 1 - lr * wd)
                torch._foreach_lerp_(m, grads, 1 - beta1)
                torch._foreach_mul_(v, beta2)
                torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
                step_size = lr / (1 - beta1**step)
                denom = torch._foreach_sqrt(v)
                torch._foreach_div_(denom, math.sqrt(1 - beta2**step))
                torch._foreach_add_(denom, eps)
                torch._foreach_addcdiv_(ps, m, denom, -step_size)
        return loss


def get_lr_cosine_schedule(
    it: int, max_learning_rate: float, min_learning_rate: float, warmup_iters: int, cosine_cycle_iters: int
) -> float:
    """Linear warm-up to ``max_learning_rate`` over ``warmup_iters``, cosine decay to
    ``min_learning_rate`` at ``cosine_cycle_iters``, constant afterwards."""
    if it < warmup_iters:
        return max_learning_rate * it / warmup_iters
    if it > cosine_cycle_iters:
        return min_learning_rate
    progress = (it - warmup_iters) / max(1, cosine_cycle_iters - warmup_iters)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return min_learning_rate + cosine * (max_learning_rate - min_learning_rate)
