#!/usr/bin/env bash
# Gluon dK/dV kernel with P and dS through shared memory (overlapped by default): GPU tests, then d 128 and d 64 steps
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 200 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps --kernels \
  --gluon-bwd-steps default dkdv-no-overlap dkdv-queries-32 --rep-ms 100 --out $L/gbwd128 > $L/gbwd128.log 2>&1; echo "bench rc $?" | tee -a $L/gbwd128.log
timeout 100 python3 -m flashattn.hopper_bench --head-dim 64 --batch 4 --heads 16 --seqs 4096 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps --kernels \
  --gluon-bwd-steps default dkdv-no-overlap dq-keys-128 --rep-ms 100 --out $L/gbwd64 > $L/gbwd64.log 2>&1; echo "bench rc $?" | tee -a $L/gbwd64.log
tail -3 $L/tests.log; grep -E "FAIL|Error" $L/tests.log | head -10
grep -hE "(bwd|dq|dkdv) (gbwd|sdpa-cudnn|portable|hopper-default)" $L/gbwd128.log $L/gbwd64.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
