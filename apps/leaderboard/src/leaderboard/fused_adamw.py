"""AdamW as one Triton kernel per fp32 tensor: read p, g, m, v once, write p, m, v once.

The update is ``cs336_basics.AdamW``'s (and ``torch.optim.AdamW``'s), element by element:
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
with the step-dependent factors computed on the host in float64 and passed as fp32 scalars.

Limits: parameters, their state and their gradients must be fp32 and contiguous (the master weights
of a sharded model are); gradients in another dtype are upcast per step. Sharded (DTensor)
parameters are updated through their local shard, so the optimizer never communicates. Runs on
CUDA, or anywhere under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from cs336_basics import AdamW
from torch import Tensor
from torch.distributed.tensor import DTensor

BLOCK = 4096  # elements per program: 16 KiB of each fp32 stream, enough to hide latency on H200


@triton.jit
def _adamw_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr, n, decay, beta1, beta2, step_size, inv_bias2_sqrt, eps, BLOCK: tl.constexpr
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    p = tl.load(p_ptr + offsets, mask=mask)
    g = tl.load(g_ptr + offsets, mask=mask)
    m = tl.load(m_ptr + offsets, mask=mask)
    v = tl.load(v_ptr + offsets, mask=mask)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p * decay - step_size * m / (tl.sqrt(v) * inv_bias2_sqrt + eps)
    tl.store(p_ptr + offsets, p, mask=mask)
    tl.store(m_ptr + offsets, m, mask=mask)
    tl.store(v_ptr + offsets, v, mask=mask)


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def adamw_update_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW step of ``param`` in place (all four tensors fp32, contiguous, same shape)."""
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.shape != param.shape:
            raise ValueError(
                f"{name} must be a contiguous fp32 tensor of shape {tuple(param.shape)}, "
                f"got {t.dtype} {tuple(t.shape)} contiguous={t.is_contiguous()}"
            )
    n = param.numel()
    if n == 0:
        return
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        n,
        1.0 - lr * weight_decay,
        beta1,
        beta2,
        lr / (1.0 - beta1**step),
        1.0 / math.sqrt(1.0 - beta2**step),
        eps,
        BLOCK=BLOCK,
    )


class TritonAdamW(AdamW):
    """``cs336_basics.AdamW`` (same arguments and checks) running :func:`adamw_update_` per parameter."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                local = _local(p)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(local)
                    state["exp_avg_sq"] = torch.zeros_like(local)
                state["step"] += 1
                grad = _local(p.grad).float()
                adamw_update_(
                    local,
                    grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state["step"],
                    group["lr"],
                    beta1,
                    beta2,
                    group["eps"],
                    group["weight_decay"],
                )
        return loss
