"""Runs the Triton kernels under TRITON_INTERPRET=1 on the CPU and prints their errors as JSON.

Executed in a subprocess by ``test_triton_interpret.py``: the interpreter must be switched on before any
Triton
kernel is defined, which a pytest process that already imported ``flashattn`` cannot do.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch
from flashattn.plain import reference
from flashattn.portable.tiles import KernelConfigs, TileConfig
from flashattn.triton_flash import FlashAttention2Triton
from harness.testing import relative_error
from pinned_tiles import PortableWithTiles

# Small tiles so that seq 17..130 spans several query and key tiles, the diagonal and ragged tails;
# forward and dQ use 16 x 32 and dK/dV 32 x 16 so that unequal tile sides are exercised too.
# dK/dV take the tf32x3 route (the interpreter multiplies exactly; its accuracy is checked on the GPU)
PINNED = KernelConfigs(TileConfig(16, 32, 4, 1), TileConfig(16, 32, 4, 1, "tf32x3"), TileConfig(32, 16, 4, 1))

# (name, leading dims, seq_q, seq_k, head_dim, causal, dtype)
CASES = [
    ("single", (), 1, 1, 16, True, torch.float32),
    ("seq17_causal", (2,), 17, 17, 16, True, torch.float32),
    ("seq100_noncausal", (1, 2), 100, 100, 32, False, torch.float32),
    ("q37_k130_causal", (2,), 37, 130, 16, True, torch.float32),
    ("q130_k37_noncausal", (), 130, 37, 16, False, torch.float32),
    ("seq97_d64_causal", (), 97, 97, 64, True, torch.float32),
    ("seq50_fp16_causal", (2,), 50, 50, 16, True, torch.float16),
    ("strided_q40_k70", (2, 3), 40, 70, 16, True, torch.float32),
]


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative to the reference's norm; below 0.1 per element (unit-variance inputs give outputs and
    gradients of order 0.1-1) the reference counts as zero, as the true dQ and dK of a single key are."""
    return relative_error(x, ref, floor=0.1)


def _run(lead, seq_q, seq_k, head_dim, causal, dtype, strided) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seq_q * 1000 + seq_k)
    q64, k64, v64 = (
        torch.randn(*lead, s, head_dim, generator=gen, dtype=torch.float64) for s in (seq_q, seq_k, seq_k)
    )
    do64 = torch.randn(*lead, seq_q, head_dim, generator=gen, dtype=torch.float64)
    ref_in = [t.clone().requires_grad_() for t in (q64, k64, v64)]
    o_ref, lse_ref = reference(*ref_in, is_causal=causal)
    o_ref.backward(do64)
    if strided:  # (..., seq, heads-like, d) storage read through a transposed view
        ours = [
            t.to(dtype).transpose(-2, -3).contiguous().transpose(-2, -3).requires_grad_()
            for t in (q64, k64, v64)
        ]
    else:
        ours = [t.to(dtype).requires_grad_() for t in (q64, k64, v64)]
    o = PortableWithTiles.apply(PINNED, *ours, causal)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do64.to(dtype))
    errors = {
        "dtype": str(dtype).removeprefix("torch."),
        "o": _rel_err(o, o_ref),
        "lse": _rel_err(lse, lse_ref),
    }
    for name, ours_t, ref_t in zip(("dq", "dk", "dv"), ours, ref_in, strict=True):
        errors[name] = _rel_err(ours_t.grad, ref_t.grad)
    return errors


def only_lse_saved_new() -> float:
    """1.0 when ``FlashAttention2Triton`` (default tiles) saves ``L (..., seq_q)`` as its one new tensor."""
    q, k, v = (torch.randn(2, 3, 19, 16, requires_grad=True) for _ in range(3))
    o = FlashAttention2Triton.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    new = [t for t in saved if t.data_ptr() not in {x.data_ptr() for x in (q, k, v, o)}]
    return float(len(new) == 1 and tuple(new[0].shape) == (2, 3, 19))


def main() -> None:
    torch.set_num_threads(1)
    results = {
        name: _run(lead, sq, sk, d, causal, dtype, name.startswith("strided"))
        for name, lead, sq, sk, d, causal, dtype in CASES
    }
    results["only_lse_new"] = only_lse_saved_new()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
