#!/usr/bin/env bash
# Gluon forward with O staged in Q's slots: GPU tests of every variant; ablation 2 vs 3 K/V stages at d 128
# (and d 64's 3 vs 2), each twice, in one run
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/gluon-tests.log 2>&1; echo "gluon tests rc $?" | tee -a $L/gluon-tests.log
timeout 200 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps stages-2 stages-3 stages-2 stages-3 --rep-ms 100 --out $L/stages > $L/stages.log 2>&1; echo "bench rc $?" | tee -a $L/stages.log
timeout 100 python3 -m flashattn.hopper_bench --head-dim 64 --batch 4 --heads 16 --seqs 4096 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps stages-2 stages-3 stages-2 stages-3 --rep-ms 100 --out $L/stages-d64 > $L/stages-d64.log 2>&1; echo "bench d64 rc $?" | tee -a $L/stages-d64.log
tail -3 $L/gluon-tests.log
grep -E "fwd (gluon|sdpa-cudnn)" $L/stages.log $L/stages-d64.log | sed 's/.*logs.//'
cd $OUT && tar czf logs.tgz logs && rm -rf logs
