#!/usr/bin/env bash
# Gluon backward (dQ and dK/dV kernels in Gluon): GPU tests, then the steps with each kernel timed alone, d 128
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 280 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps --kernels \
  --gluon-bwd-steps default triton-dq dq-no-overlap dq-keys-128 dkdv-queries-32-overlap --rep-ms 100 --out $L/gbwd > $L/gbwd.log 2>&1; echo "bench rc $?" | tee -a $L/gbwd.log
tail -3 $L/tests.log; grep -E "FAIL|Error" $L/tests.log | head -10
grep -E "(bwd|dq|dkdv) (gbwd|sdpa-cudnn|portable)" $L/gbwd.log
tail -2 $L/gbwd.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
