#!/usr/bin/env bash
# Five-product Gluon backward, schedule variants: correctness and bitwise repeats of each, then time at d 128 and d 64
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -c "
import torch
from flashattn import hopper
variants = {'default': {}, 'defer_stage': {'defer_stage': True}, 'early_dq': {'early_dq': True}}
for shape, hk, causal in [((1, 4, 1000, 128), 2, True), ((1, 4, 4097, 128), 4, False), ((2, 2, 300, 64), 1, True), ((1, 8, 2049, 64), 2, False)]:
    b, h, s, d = shape
    q, do = (torch.randn(shape, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, hk, s, d, device='cuda', dtype=torch.bfloat16) for _ in range(2))
    o, lse = hopper.gluon_forward(q, k, v, causal)
    seven = hopper.gluon_backward(q, k, v, o, lse, do, causal)
    for name, ch in variants.items():
        base = hopper.configs_for(d)
        with hopper.pinned_configs(base._replace(gluon_dkdvdq=base.gluon_dkdvdq._replace(**ch))):
            five = hopper.gluon_backward5(q, k, v, o, lse, do, causal)
            again = hopper.gluon_backward5(q, k, v, o, lse, do, causal)
        errs = [((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(five, seven)]
        same = all(torch.equal(a, b) for a, b in zip(five, again))
        print(shape, hk, causal, name, 'ok' if max(errs) < 1e-2 and same else 'FAIL', [f'{e:.1e}' for e in errs], 'bitwise' if same else 'DIFFERS', flush=True)
" > $L/variants.log 2>&1; echo "variants rc $?" | tee -a $L/variants.log
timeout 150 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
  --gluon-bwd-steps default --gluon-bwd5-steps default defer-stage --rep-ms 40 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
timeout 120 python3 -m flashattn.hopper_bench --head-dim 64 --batch 4 --heads 16 --seqs 4096 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
  --gluon-bwd-steps default --gluon-bwd5-steps default defer-stage early-dq early-dq-defer-stage --rep-ms 40 --out $L/bench-d64 > $L/bench-d64.log 2>&1; echo "bench-d64 rc $?" | tee -a $L/bench-d64.log
cat $L/variants.log; grep -E "\| bwd" $L/bench.md $L/bench-d64.md | grep -v "tma-\|hopper-def\|flash\|portable" | cut -c1-150
cd $OUT && tar czf logs.tgz logs && rm -rf logs
