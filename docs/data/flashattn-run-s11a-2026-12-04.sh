#!/usr/bin/env bash
# The closing run of the sm90 path: every GPU test of the flashattn package (portable, Triton-language Hopper,
# Gluon, features), then the benchmark's whole multihead list once with the kernels as they stand
mkdir -p $OUT/logs; L=$OUT/logs
date -u +"start %F %T UTC"
timeout 230 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests \
  > $L/tests-flashattn.log 2>&1; echo "flashattn gpu tests rc $?" | tee -a $L/tests-flashattn.log
tail -3 $L/tests-flashattn.log; grep -E "FAILED|Error" $L/tests-flashattn.log | head -10
date -u +"bench %F %T UTC"
timeout 330 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 16384 32768 65536 \
  --impls ours portable sdpa_flash sdpa_cudnn --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1
echo "bench rc $?" | tee -a $L/bench.log
date -u +"end %F %T UTC"
grep -E "^\|" $L/bench/*.md | head -60 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
