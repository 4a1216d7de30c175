#!/usr/bin/env bash
mkdir -p $OUT/logs; L=$OUT/logs
python3 -m pytest packages/flashattn/tests/test_hopper_gpu.py -q -x -n 8 -p no:cacheprovider \
  -k "gluon_backward or sliding_window or public" 2>&1 | tail -5 | tee $L/gpu-tests.log
timeout 200 python3 .device/s10a.py  # kept as docs/data/flashattn-host-pieces-2026-12-02.py.txt; > $L/host-pieces.log 2>&1; echo "host rc $?"
grep "ms/call" $L/host-pieces.log
for order in "default gqa-head-major" "gqa-head-major default"; do
  python3 -m flashattn.hopper_bench --heads 32 --kv-heads 8 --seqs 8192 16384 --causal yes --fwd-steps \
    --bwd-steps --bwd5-steps --gluon-steps --gluon-bwd5-steps --gluon-bwd-steps $order --kernels --rep-ms 100 \
    --out $L/gqa-order-${order%% *} > $L/gqa-order-${order%% *}.log 2>&1; echo "bench rc $?"
done
grep -h "gbwd\|cudnn" $L/gqa-order-*.log | grep -v fwd
cd $OUT && tar czf logs.tgz logs && rm -rf logs
