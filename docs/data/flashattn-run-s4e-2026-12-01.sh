#!/usr/bin/env bash
# d 256 dQ on 128 queries x 32-key steps, 8 warps, 3 stages: the d 192 / 256 GPU tests, then the features benchmark
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_gpu_features.py \
  packages/flashattn/tests/test_gpu.py -k "256 or 192" > $L/gpu-tests.log 2>&1; echo "tests rc $?" | tee -a $L/gpu-tests.log
timeout 200 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
tail -2 $L/gpu-tests.log
grep -E "^\| (d256|window|gqa|packed) " $L/features.log | grep -E "ours (d128|causal|mha)|padded"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
