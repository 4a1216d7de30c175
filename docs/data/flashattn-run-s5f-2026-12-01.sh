#!/usr/bin/env bash
# Host time of the Gluon path after caching its descriptor layouts: per-call CPU time of each launcher, then the multihead table at 4096 and 8192
mkdir -p $OUT/logs; L=$OUT/logs
timeout 100 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 60 python3 -c "
import time, torch
from flashattn import hopper
q, k, v, do = (torch.randn(1, 32, 4096, 128, device='cuda', dtype=torch.bfloat16) for _ in range(4))
o, lse = hopper.gluon_forward(q, k, v, True)
calls = {'gluon_forward': lambda: hopper.gluon_forward(q, k, v, True), 'forward': lambda: hopper.forward(q, k, v, True),
         'gluon_backward': lambda: hopper.gluon_backward(q, k, v, o, lse, do, True), 'backward': lambda: hopper.backward(q, k, v, o, lse, do, True)}
for name, fn in calls.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter(); n = 20
    for _ in range(n): fn()
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    print(f'{name}: host {host * 1e3:.3f} ms per call (1, 32, 4096, 128) causal', flush=True)
" > $L/host.log 2>&1; echo "host rc $?" | tee -a $L/host.log
timeout 200 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 \
  --impls ours portable hopper sdpa_flash sdpa_cudnn gluon --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
tail -2 $L/tests.log; cat $L/host.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
