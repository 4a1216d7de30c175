#!/usr/bin/env bash
# d 128 backward tune (causal, the tile table's shape), with the deeper pipelines the old shared-memory estimate hid
mkdir -p $OUT/logs; L=$OUT/logs
timeout 240 python3 -m flashattn.tune --seq 16384 --heads 32 --head-dim 128 --dtype bf16 --kernels dkdv dq --all \
  --rep-ms 40 --jobs 16 --out $L/tune > $L/tune.log 2>&1; echo "tune rc $?" | tee -a $L/tune.log
grep -E "^(dkdv|dq) " $L/tune.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
