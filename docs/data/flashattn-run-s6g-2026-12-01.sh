#!/usr/bin/env bash
# Five-product Gluon backward with the 32-byte staging swizzle: errors and bitwise repeats against the seven-product backward, then time
mkdir -p $OUT/logs; L=$OUT/logs
timeout 100 python3 -c "
import torch
from flashattn import hopper
for shape, hk, causal in [((1, 4, 1000, 128), 2, True), ((1, 4, 4097, 128), 4, False), ((2, 2, 300, 64), 1, True), ((1, 8, 2049, 64), 2, False)]:
    b, h, s, d = shape
    q, do = (torch.randn(shape, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    o, lse = hopper.gluon_forward(q, k, v, causal)
    seven = hopper.gluon_backward(q, k, v, o, lse, do, causal)
    five = hopper.gluon_backward5(q, k, v, o, lse, do, causal)
    again = hopper.gluon_backward5(q, k, v, o, lse, do, causal)
    errs = [((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(five, seven)]
    same = all(torch.equal(a, b) for a, b in zip(five, again))
    print(shape, hk, causal, 'ok' if max(errs) < 1e-2 and same else 'FAIL', [f'{e:.1e}' for e in errs], 'bitwise' if same else 'DIFFERS', flush=True)
" > $L/smoke.log 2>&1; rc=$?; echo "smoke rc $rc" | tee -a $L/smoke.log
if [ $rc -eq 0 ]; then
timeout 150 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
  --gluon-bwd-steps default --gluon-bwd5-steps default --rep-ms 40 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
fi
cat $L/smoke.log; grep -E "g5-default|gbwd-default|sdpa-cudnn" $L/bench.md | grep bwd | cut -c1-120
cd $OUT && tar czf logs.tgz logs && rm -rf logs
