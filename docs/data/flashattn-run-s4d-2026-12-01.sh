#!/usr/bin/env bash
# 1) every flashattn GPU test (and the CUDA case of tests/test_packed_documents.py) with d 256's dQ at 4 stages and
#    the Gluon forward staging O in Q's slots; 2) d 256 tune of every kernel, including the shapes the shared-memory
#    estimate rules out; 3) the features benchmark
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_gpu_features.py \
  packages/flashattn/tests/test_gpu.py packages/flashattn/tests/test_hopper_gpu.py packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_hopper_dispatch.py tests/test_packed_documents.py > $L/gpu-tests.log 2>&1; echo "tests rc $?" | tee -a $L/gpu-tests.log
timeout 200 python3 -m flashattn.tune --seq 8192 --heads 16 --head-dim 256 --dtype bf16 --kernels forward dq dk dv --all \
  --rep-ms 30 --jobs 16 --out $L/tune > $L/tune.log 2>&1; echo "tune rc $?" | tee -a $L/tune.log
timeout 200 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
tail -2 $L/gpu-tests.log
grep -E "^(forward|dq|dk|dv) |compiled .*(Error|error)" $L/tune.log | grep -v ": ok$"
grep -E "^\| (d256|window|gqa|packed) " $L/features.log | grep -E "ours (d128|causal|mha)|padded"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
