#!/usr/bin/env bash
# flashattn's GPU tests on the merged tree (five-product backward, split dK/dV at d 256), then
# the features benchmark (GQA, d 256 with the split, packed documents, window) in one run
mkdir -p $OUT/logs/features; L=$OUT/logs; t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 )) s" | tee -a $L/summary.txt; }
stamp tests
timeout 80 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_gpu_features.py \
  packages/flashattn/tests/test_gpu.py packages/flashattn/tests/test_hopper_gpu.py packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_hopper_dispatch.py > $L/test-flashattn.log 2>&1; echo "flashattn tests rc $?" | tee -a $L/summary.txt
tail -4 $L/test-flashattn.log
stamp features
timeout 125 python3 -m flashattn.bench --only features --out $L/features > $L/features/bench.log 2>&1; echo "features rc $?" | tee -a $L/summary.txt
stamp end
grep -E "^\| (gqa|d256|packed|window)" $L/features/bench.log | cut -c1-200 | head -14
cd $OUT && tar czf logs.tgz logs && rm -rf logs
