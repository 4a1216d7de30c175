#!/usr/bin/env bash
# the two compiled-vs-eager cells run F could not finish (xl bf16 train, 10B fp32 forward), 5 + 10 steps
mkdir -p $OUT/logs; L=$OUT/logs; t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 )) s" | tee -a $L/summary.txt; }
stamp xl
timeout 300 python3 -m profiling.bench --sizes xl --contexts 512 --modes train --dtypes bf16 --compile both \
  --warmup 5 --steps 10 --out $L/compiled --name compiled-xl-bf16-train > $L/compiled-xl.log 2>&1; echo "rc $?" >> $L/summary.txt
stamp 10B
left=$(( 570 - ($(date +%s) - t0) ))
timeout $left python3 -m profiling.bench --sizes 10B --contexts 512 --modes forward --dtypes fp32 --compile both \
  --warmup 5 --steps 10 --out $L/compiled --name compiled-10B-fp32-forward > $L/compiled-10B.log 2>&1; echo "rc $?" >> $L/summary.txt
stamp end
tail -5 $L/compiled-xl.log $L/compiled-10B.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
