#!/usr/bin/env bash
# The persistent Gluon forward with claimed items (each program takes the next unstarted item from a counter):
# GPU tests of every forward variant and the public path, then default against persistent in one run per
# shape, twice, with SDPA cuDNN measured alongside
mkdir -p $OUT/logs; L=$OUT/logs
timeout 220 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_hopper_gpu.py -k "gluon_gpu or window or public" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log; tail -2 $L/tests.log
grep -E "FAILED|Error" $L/tests.log | head -10
NONE="--fwd-steps --bwd-steps --bwd5-steps --gluon-bwd-steps --gluon-bwd5-steps --gluon-steps default persistent --rep-ms 60"
for r in 1 2; do
  timeout 120 python3 -m flashattn.hopper_bench --seqs 4096 8192 16384 32768 --causal both $NONE --out $L/d128-$r > $L/d128-$r.log 2>&1; echo "d128 $r rc $?"
  timeout 60 python3 -m flashattn.hopper_bench --batch 4 --heads 16 --head-dim 64 --seqs 4096 --causal both $NONE --out $L/d64a-$r > $L/d64a-$r.log 2>&1; echo "d64a $r rc $?"
  timeout 60 python3 -m flashattn.hopper_bench --batch 2 --heads 20 --head-dim 64 --seqs 8192 --causal both $NONE --out $L/d64b-$r > $L/d64b-$r.log 2>&1; echo "d64b $r rc $?"
  timeout 60 python3 -m flashattn.hopper_bench --heads 32 --kv-heads 8 --seqs 8192 --causal yes $NONE --out $L/gqa-$r > $L/gqa-$r.log 2>&1; echo "gqa $r rc $?"
done
for f in $L/d*-*.log $L/gqa-*.log; do echo "== $f"; grep -E " fwd (gluon-|sdpa-cudnn)" $f | sed 's/ TFLOP.*//'; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
