"""A/B timing of the Gluon forward: this tree's kernel against a copy of the previous one (scale not folded).

The copy is `git show 79f0605:packages/flashattn/src/flashattn/gluon_fwd.py`, saved as
.device/gluon_fwd_old.py for the run; run as `python3 .device/fold_ab.py` from the repository root on the GPU
machine. Prints CSV: shape, causal, step, ms, TFLOP/s, and the largest difference from the previous kernel.
"""

import importlib.util

import flashattn.gluon_fwd as current
import torch
from flashattn import hopper
from flashattn.benchutil import sdpa
from harness.timing import do_bench
from torch.nn.attention import SDPBackend

spec = importlib.util.spec_from_file_location("gluon_fwd_old", ".device/gluon_fwd_old.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
kernels = {"folded": current.gluon_fwd_kernel, "unfolded": old.gluon_fwd_kernel}
cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)


def ms_of(fn, *args) -> float:
    return do_bench(lambda: fn(*args), "cuda", warmup_ms=50, rep_ms=100)


print("shape,causal,step,ms,tflops,max_abs_diff_vs_unfolded")
for b, h, d, seqs in ((1, 32, 128, (8192, 32768)), (4, 16, 64, (4096,))):
    for S in seqs:
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(S)
            q, k, v = (
                torch.randn(b, h, S, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)
            )
            flops = 4 * b * h * S * S * d / (2 if causal else 1)
            shape = f"{b}x{h}x{S}x{d}"
            outs = {}
            for name in ("unfolded", "folded", "unfolded", "folded"):
                current.gluon_fwd_kernel = kernels[name]
                outs[name] = hopper.gluon_forward(q, k, v, causal)[0]
                ms = ms_of(hopper.gluon_forward, q, k, v, causal)
                diff = (outs[name].float() - outs["unfolded"].float()).abs().max().item()
                print(f"{shape},{causal},{name},{ms:.4f},{flops / ms / 1e9:.1f},{diff:.2e}", flush=True)
            with torch.no_grad():
                ms = ms_of(cudnn, q, k, v, causal)
            print(f"{shape},{causal},sdpa-cudnn,{ms:.4f},{flops / ms / 1e9:.1f},", flush=True)
            current.gluon_fwd_kernel = kernels["folded"]
