"""Mixed precision, observed: accumulation error by dtype, and the dtypes autocast actually produces.

The tables of ``python -m profiling.precision``:

1. Summing 0.01 a thousand times with an fp32 accumulator, an fp16 one, an fp32 one fed fp16 addends,
   and an fp32 one fed addends explicitly upcast to fp32; the result and its error against 10.
2. A toy model (Linear to 10 units, ReLU, LayerNorm, Linear) run under autocast (fp16 by default, and
   bf16): the dtypes of its parameters, the first linear's output, the layer norm's output, the logits,
   the loss and the gradients, read off the tensors by forward hooks, not written down by hand.

Limits: autocast runs on the chosen device (fp16 autocast on CPU needs a recent torch; it has it).
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}


def accumulate(total_dtype: torch.dtype, addend_dtype: torch.dtype, upcast: bool = False, n: int = 1000,
               value: float = 0.01) -> float:
    """``sum`` starting from 0 in ``total_dtype`` of ``n`` addends ``value`` stored in ``addend_dtype``."""
    total = torch.tensor(0.0, dtype=total_dtype)
    for _ in range(n):
        addend = torch.tensor(value, dtype=addend_dtype)
        total += addend.to(total_dtype) if upcast else addend
    return float(total)


def accumulation_table(n: int = 1000, value: float = 0.01) -> pd.DataFrame:
    """The four accumulation variants with their result and absolute error against ``n * value``."""
    cases = [
        ("fp32 total, fp32 addends", torch.float32, torch.float32, False),
        ("fp16 total, fp16 addends", torch.float16, torch.float16, False),
        ("fp32 total, fp16 addends", torch.float32, torch.float16, False),
        ("fp32 total, fp16 addends upcast", torch.float32, torch.float16, True),
    ]
    rows = []
    for name, total_dtype, addend_dtype, upcast in cases:
        result = accumulate(total_dtype, addend_dtype, upcast, n, value)
        rows.append({"case": name, "result": result, "abs_error": abs(result - n * value),
                     "addend_as_stored": float(torch.tensor(value, dtype=addend_dtype))})
    return pd.DataFrame(rows)


class ToyModel(nn.Module):
    """Linear(in, 10) -> ReLU -> LayerNorm(10) -> Linear(10, out): ``(batch, in)`` -> ``(batch, out)``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def autocast_dtypes(dtype: str = "fp16", device: str = "cpu", seed: int = 0) -> pd.DataFrame:
    """Observed dtypes of the toy model's tensors under ``dtype`` autocast (a forward, loss, backward)."""
    if dtype not in LOW:
        raise ValueError(f"dtype must be one of {tuple(LOW)}, got {dtype!r}")
    torch.manual_seed(seed)
    model = ToyModel(17, 5).to(device)
    seen: dict[str, torch.dtype] = {}

    def observe(name: str):
        def hook(_module, _inputs, out) -> None:
            seen[name] = out.dtype

        return hook

    model.fc1.register_forward_hook(observe("first linear output"))
    model.ln.register_forward_hook(observe("layer norm output"))
    x = torch.randn(7, 17, device=device)
    target = torch.randint(0, 5, (7,), device=device)
    with torch.autocast(device_type=torch.device(device).type, dtype=LOW[dtype]):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, target)
    loss.backward()
    rows = [("parameters", {str(p.dtype) for p in model.parameters()})]
    rows += [(name, {str(d)}) for name, d in seen.items()]
    rows += [("logits", {str(logits.dtype)}), ("loss", {str(loss.dtype)}),
             ("gradients", {str(p.grad.dtype) for p in model.parameters()})]
    return pd.DataFrame([{"autocast": dtype, "tensor": name, "dtype": ", ".join(sorted(d))}
                         for name, d in rows])

