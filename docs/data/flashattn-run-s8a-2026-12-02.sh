#!/usr/bin/env bash
# The windowed Gluon backward timed against the portable backward (both after the Gluon forward), the window and
# public-path GPU tests (with the corrected expectation), then the features benchmark (row `ours window 4096 gluon`)
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 - > $L/window-bwd-timing.log 2>&1 <<'PY'
import torch
from flashattn.dispatch import pinned_kernels
from flashattn.triton_flash import FlashAttention2Triton
from harness.timing import do_bench
gen = torch.Generator(device="cuda").manual_seed(0)
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for (b, hq, hk, s, d, causal, window) in [
        (1, 32, 32, 32768, 128, True, (4095, 0)), (1, 32, 32, 8192, 128, True, (1023, 0)),
        (1, 32, 8, 8192, 128, True, (1023, 0)), (1, 32, 32, 8192, 128, False, (511, 511)),
        (2, 20, 20, 8192, 64, True, (4095, 0)), (4, 16, 16, 4096, 64, False, (255, 255))]:
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(2))
    do = torch.randn_like(q)
    row = {}
    for bwd in ("gluon", "portable", "gluon", "portable"):
        with pinned_kernels("gluon", bwd):
            o = FlashAttention2Triton.apply(q, k, v, causal, window)
        ms = do_bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), "cuda", warmup_ms=50, rep_ms=100)
        row.setdefault(bwd, []).append(ms)
    g, p = min(row["gluon"]), min(row["portable"])
    print(f"{(b, hq, hk, s, d)} causal {causal} window {window} backward ms: gluon {row['gluon']} portable {row['portable']}"
          f" best {g:.3f} / {p:.3f} speed-up {p / g:.2f}", flush=True)
PY
echo "timing rc $?"; cat $L/window-bwd-timing.log
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  -k "window or public" > $L/tests-window.log 2>&1; echo "window tests rc $?" | tee -a $L/tests-window.log; tail -3 $L/tests-window.log
timeout 240 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
grep -E "^\| (window|gqa|d256) " $L/features.log | cut -c1-170
cd $OUT && tar czf logs.tgz logs && rm -rf logs
