#!/usr/bin/env bash
# Gluon dK/dV kernel: GPU tests of the new backward, then its variants against the seven-product and portable backwards, d 128
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 200 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
  --gluon-bwd-steps default no-overlap stages-2 stages-4 queries-64 queries-64-s3 --rep-ms 100 --out $L/gbwd > $L/gbwd.log 2>&1; echo "bench rc $?" | tee -a $L/gbwd.log
tail -3 $L/tests.log; grep -E "FAIL|Error" $L/tests.log | head -10
grep -E "bwd (gbwd|sdpa-cudnn|portable|hopper-default)" $L/gbwd.log
tail -3 $L/gbwd.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
