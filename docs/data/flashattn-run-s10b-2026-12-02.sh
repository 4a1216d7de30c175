#!/usr/bin/env bash
# With the causal GQA dK/dV programs longest-first over every (batch, K/V head): the benchmark's multihead
# list at 8192 (with the GQA and d 64 rows), twice
mkdir -p $OUT/logs; L=$OUT/logs
for r in 1 2; do
  timeout 280 python3 -m flashattn.bench --only multihead --multihead-seqs 8192 \
    --impls ours portable sdpa_flash sdpa_cudnn --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench$r > $L/bench$r.log 2>&1
  echo "bench $r rc $?"
done
grep -E "^\|" $L/bench1/*.md | head -40 | cut -c1-220
cd $OUT && tar czf logs.tgz logs && rm -rf logs
