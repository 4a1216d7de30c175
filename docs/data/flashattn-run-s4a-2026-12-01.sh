#!/usr/bin/env bash
# 1) GPU tests not yet run on a GPU: packed documents through the Triton kernel, --check on one GPU, the Triton AdamW
# 2) d256 tune of dQ, dK, dV with the widened candidate lists
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -m gpu -q -n 4 -p no:randomly -p no:cacheprovider tests/test_packed_documents.py \
  apps/leaderboard/tests/test_gpu.py apps/leaderboard/tests/test_fused_adamw.py > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 300 python3 -m flashattn.tune --seq 8192 --heads 16 --head-dim 256 --dtype bf16 --kernels dq dk dv \
  --rep-ms 30 --jobs 16 --out $L/tune > $L/tune.log 2>&1; echo "tune rc $?" | tee -a $L/tune.log
tail -8 $L/tests.log
grep -E "^(dq|dk|dv) " $L/tune.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
