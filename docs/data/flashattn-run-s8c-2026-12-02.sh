#!/usr/bin/env bash
# The Gluon forward before the window plumbing (old: ccb4d52) against now (new), alternating, at d 64 and 128; and
# the public path's forward with and without autograd against the launcher alone (host time)
mkdir -p $OUT/logs; L=$OUT/logs
P=packages/flashattn/src/flashattn
mkdir -p .device/new && cp $P/gluon_fwd.py $P/hopper.py .device/new/
cat > /tmp/fwd_ab.py <<'PY'
import sys
import torch
from flashattn import hopper
from harness.timing import do_bench
tag = sys.argv[1]
gen = torch.Generator(device="cuda").manual_seed(0)
for (b, h, s, d, causal) in [(4, 16, 4096, 64, True), (4, 16, 4096, 64, False), (2, 20, 8192, 64, True),
                             (1, 32, 8192, 128, True), (1, 32, 8192, 128, False)]:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    ms = do_bench(lambda: hopper.gluon_forward(q, k, v, causal), "cuda", warmup_ms=50, rep_ms=150)
    line = f"{tag} {(b, h, s, d)} causal {causal}: gluon_forward {ms:.4f} ms"
    if tag.startswith("new"):
        from flashattn.triton_flash import FlashAttention2Triton
        pub = do_bench(lambda: FlashAttention2Triton.apply(q, k, v, causal), "cuda", warmup_ms=50, rep_ms=150)
        qg = q.detach().requires_grad_()
        grad = do_bench(lambda: FlashAttention2Triton.apply(qg, k, v, causal), "cuda", warmup_ms=50, rep_ms=150)
        line += f", public {pub:.4f} ms, public with autograd {grad:.4f} ms"
    print(line, flush=True)
PY
for tag in new1 old1 new2 old2; do cp .device/${tag%?}/gluon_fwd.py .device/${tag%?}/hopper.py $P/
  timeout 100 python3 /tmp/fwd_ab.py $tag >> $L/fwd-ab.log 2>&1; echo "$tag rc $?" >> $L/fwd-ab.log; done
cp .device/new/gluon_fwd.py .device/new/hopper.py $P/
cat $L/fwd-ab.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
