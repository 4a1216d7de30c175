"""Tensor-parallel FFN backward written out shard by shard, checked against unsharded autograd.

Layer: ``X1 = X W1``, ``X2 = X W2``, ``Z = silu(X1) * X2``, ``Y = Z W3``; ``X`` is ``(B, D)``, ``W1, W2``
are ``(D, F)``, ``W3`` is ``(F, D)``. Shard ``i`` of ``N_TP`` holds the column blocks ``W1[:, I_i]``,
``W2[:, I_i]`` and the row block ``W3[I_i, :]`` (``torch.tensor_split``, so ``F`` need not divide evenly).
The all-reduces are sums over the shards' partial results, done here in one process with real tensors:

- forward: ``Y = sum_i Z_i W3_i``                                   (all-reduce of ``(B, D)``)
- backward, per shard: ``dZ_i = dY W3_i^T``, ``dW3_i = Z_i^T dY``, ``dX2_i = dZ_i * silu(X1_i)``,
  ``dX1_i = dZ_i * X2_i * silu'(X1_i)``, ``dW1_i = X^T dX1_i``, ``dW2_i = X^T dX2_i``
- ``dX = sum_i (dX1_i W1_i^T + dX2_i W2_i^T)``                      (all-reduce of ``(B, D)``)
"""

from __future__ import annotations

import torch
from torch import Tensor


def _silu_and_derivative(x: Tensor) -> tuple[Tensor, Tensor]:
    sig = torch.sigmoid(x)
    return x * sig, sig * (1 + x * (1 - sig))


def _check_shapes(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, dy: Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be (B, D), got shape {tuple(x.shape)}")
    b, d = x.shape
    f = w1.shape[-1]
    expected = {"w1": (d, f), "w2": (d, f), "w3": (f, d), "dy": (b, d)}
    for name, tensor in (("w1", w1), ("w2", w2), ("w3", w3), ("dy", dy)):
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(tensor.shape)}")


def tensor_parallel_ffn(
    x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, dy: Tensor, shards: int
) -> dict[str, Tensor]:
    """Forward and backward of the FFN over ``shards`` tensor-parallel shards.

    Returns ``y``, ``dx``, ``dw1``, ``dw2``, ``dw3``; the weight gradients are the shards' blocks put back
    together. Each shard's work is done by :func:`tp_shard_forward` and :func:`tp_shard_backward`.
    """
    _check_shapes(x, w1, w2, w3, dy)
    if not isinstance(shards, int) or not 1 <= shards <= w1.shape[1]:
        raise ValueError(f"shards must be an int in [1, F={w1.shape[1]}], got {shards!r}")
    w1s, w2s = w1.tensor_split(shards, dim=1), w2.tensor_split(shards, dim=1)
    w3s = w3.tensor_split(shards, dim=0)
    forwards = [tp_shard_forward(x, a, b, c) for a, b, c in zip(w1s, w2s, w3s, strict=True)]
    y = torch.stack([partial for partial, _ in forwards]).sum(0)  # all-reduce
    backwards = [
        tp_shard_backward(x, a, b, c, saved, dy)
        for a, b, c, (_, saved) in zip(w1s, w2s, w3s, forwards, strict=True)
    ]
    dx = torch.stack([grads["dx_partial"] for grads in backwards]).sum(0)  # all-reduce
    return {
        "y": y,
        "dx": dx,
        "dw1": torch.cat([grads["dw1"] for grads in backwards], dim=1),
        "dw2": torch.cat([grads["dw2"] for grads in backwards], dim=1),
        "dw3": torch.cat([grads["dw3"] for grads in backwards], dim=0),
    }


def tp_shard_forward(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """One shard's forward: its partial ``Y_i = Z_i W3_i`` and what its backward needs."""
    x1, x2 = x @ w1, x @ w2
    act, act_grad = _silu_and_derivative(x1)
    z = act * x2
    return z @ w3, {"x2": x2, "act": act, "act_grad": act_grad, "z": z}


def tp_shard_backward(
    x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, saved: dict[str, Tensor], dy: Tensor
) -> dict[str, Tensor]:
    """One shard's backward: its weight gradients and its partial ``dX_i`` (summed by the all-reduce)."""
    dz = dy @ w3.T
    dx2 = dz * saved["act"]
    dx1 = dz * saved["x2"] * saved["act_grad"]
    return {
        "dw3": saved["z"].T @ dy,
        "dw1": x.T @ dx1,
        "dw2": x.T @ dx2,
        "dx_partial": dx1 @ w1.T + dx2 @ w2.T,
    }


def unsharded_reference(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, dy: Tensor) -> dict[str, Tensor]:
    """The same quantities from torch autograd on the whole layer (``silu`` from ``torch.nn.functional``)."""
    _check_shapes(x, w1, w2, w3, dy)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w1, w2, w3)]
    xl, w1l, w2l, w3l = leaves
    y = (torch.nn.functional.silu(xl @ w1l) * (xl @ w2l)) @ w3l
    y.backward(dy)
    return {"y": y.detach(), "dx": xl.grad, "dw1": w1l.grad, "dw2": w2l.grad, "dw3": w3l.grad}


def max_errors(
    batch: int, d_model: int, d_ff: int, shards: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> dict[str, float]:
    """Largest absolute difference of ``y, dx, dw1, dw2, dw3`` between the sharded and unsharded layer."""
    gen = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(batch, d_model, generator=gen, dtype=dtype) for _ in range(2))
    w1, w2 = (torch.randn(d_model, d_ff, generator=gen, dtype=dtype) / d_model**0.5 for _ in range(2))
    w3 = torch.randn(d_ff, d_model, generator=gen, dtype=dtype) / d_ff**0.5
    sharded = tensor_parallel_ffn(x, w1, w2, w3, dy, shards)
    reference = unsharded_reference(x, w1, w2, w3, dy)
    return {name: float((sharded[name] - reference[name]).abs().max()) for name in reference}
