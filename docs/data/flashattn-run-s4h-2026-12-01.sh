#!/usr/bin/env bash
# The multihead shapes with every column in one run, after the Gluon forward's folded scale (run 3 of the Hopper table)
mkdir -p $OUT/logs; L=$OUT/logs
timeout 240 python3 -m flashattn.bench --only multihead --multihead-seqs 8192 32768 \
  --impls ours portable hopper sdpa_flash sdpa_cudnn gluon --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
tail -3 $L/bench.log; ls $L/bench
cd $OUT && tar czf logs.tgz logs && rm -rf logs
