#!/usr/bin/env bash
# The Gluon forward with sliding windows: its GPU tests (and the window, Gluon and public-path tests around it),
# then the features benchmark (its window rows now run the Gluon forward) and the window forward timed alone
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -m gpu -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  -k "window or public" > $L/tests-window.log 2>&1; echo "window tests rc $?" | tee -a $L/tests-window.log; tail -3 $L/tests-window.log
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_gpu_features.py > $L/tests-gluon-features.log 2>&1; echo "gluon+features tests rc $?" | tee -a $L/tests-gluon-features.log; tail -3 $L/tests-gluon-features.log
timeout 240 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
grep -E "^\| (window|gqa) " $L/features.log | cut -c1-170
timeout 120 python3 - > $L/window-timing.log 2>&1 <<'PY'
import torch
from flashattn.dispatch import pinned_kernels
from flashattn.triton_flash import FlashAttention2Triton
from harness.timing import do_bench
gen = torch.Generator(device="cuda").manual_seed(0)
for (b, h, s, d, window) in [(1, 32, 32768, 128, (4095, 0)), (1, 32, 8192, 128, (1023, 0)), (2, 20, 8192, 64, (4095, 0))]:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    row = []
    for fwd in ("gluon", "portable"):
        with pinned_kernels(fwd, "portable"):
            ms = do_bench(lambda: FlashAttention2Triton.apply(q, k, v, True, window), "cuda", warmup_ms=50, rep_ms=100)
        row.append(ms)
    print(f"{(b, h, s, d)} window {window} causal forward ms: gluon {row[0]:.3f} portable {row[1]:.3f} speed-up {row[1] / row[0]:.2f}", flush=True)
PY
echo "timing rc $?"; cat $L/window-timing.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
