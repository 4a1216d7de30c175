#!/usr/bin/env bash
# A second features run on the final tree: is the d 256 ratio stable between runs?
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
grep -E "^\| (d256|window|gqa|packed) " $L/features.log | grep -E "ours (d128|causal|mha)|padded"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
