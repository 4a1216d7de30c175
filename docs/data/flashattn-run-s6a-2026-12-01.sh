#!/usr/bin/env bash
# Five-product Gluon backward: a smoke run (deadlock guard), its GPU tests, then its time against the seven-product Gluon backward and cuDNN
mkdir -p $OUT/logs; L=$OUT/logs
timeout 90 python3 -c "
import torch
from flashattn import hopper
for shape, hk, causal in [((1, 2, 1000, 128), 2, True), ((1, 4, 4097, 128), 2, False), ((2, 2, 300, 64), 1, True)]:
    b, h, s, d = shape
    q, do = (torch.randn(shape, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    o, lse = hopper.gluon_forward(q, k, v, causal)
    seven = hopper.gluon_backward(q, k, v, o, lse, do, causal)
    five = hopper.gluon_backward5(q, k, v, o, lse, do, causal)
    torch.cuda.synchronize()
    print(shape, hk, causal, [f'{((a.float() - r.float()).norm() / r.float().norm()).item():.2e}' for a, r in zip(five, seven)], flush=True)
" > $L/smoke.log 2>&1; rc=$?; echo "smoke rc $rc" | tee -a $L/smoke.log
if [ $rc -eq 0 ]; then
timeout 200 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward5 or five" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 200 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
  --gluon-bwd-steps default --gluon-bwd5-steps default stages-2 --rep-ms 40 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
fi
cat $L/smoke.log; tail -3 $L/tests.log; grep -E "bwd|fwd" $L/bench.md | grep -v "tma-\|gluon-" | head -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs
