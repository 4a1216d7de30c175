#!/usr/bin/env bash
# 1) Gluon forward GPU tests, every variant (pingpong new); d192/d256 feature tests (dQ now 3 stages)
# 2) d256 tune, widened lists; 3) Gluon ablation default vs pingpong, twice each, in one run
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/gluon-tests.log 2>&1; echo "gluon tests rc $?" | tee -a $L/gluon-tests.log
timeout 150 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_gpu_features.py -k "256 or 192" > $L/d256-tests.log 2>&1; echo "d256 tests rc $?" | tee -a $L/d256-tests.log
timeout 150 python3 -m flashattn.tune --seq 8192 --heads 16 --head-dim 256 --dtype bf16 --kernels dq dk dv \
  --rep-ms 30 --jobs 16 --out $L/tune > $L/tune.log 2>&1; echo "tune rc $?" | tee -a $L/tune.log
timeout 200 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps default pingpong default pingpong --rep-ms 100 --out $L/pingpong > $L/pingpong.log 2>&1; echo "bench rc $?" | tee -a $L/pingpong.log
tail -3 $L/gluon-tests.log; tail -3 $L/d256-tests.log
grep -E "^(dq|dk|dv) " $L/tune.log
grep -E "fwd (gluon|sdpa-cudnn)" $L/pingpong.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
