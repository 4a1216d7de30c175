#!/usr/bin/env bash
# With the persistent forward (claimed items) as the d 64 default: every Hopper GPU test, then the benchmark's
# whole multihead list (public path against cuDNN, flash and the portable kernels, one run)
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/tests-hopper.log 2>&1; echo "hopper tests rc $?" | tee -a $L/tests-hopper.log; tail -2 $L/tests-hopper.log
grep -E "FAILED|Error" $L/tests-hopper.log | head -10
timeout 330 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 16384 32768 65536 \
  --impls ours portable sdpa_flash sdpa_cudnn --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1
echo "bench rc $?" | tee -a $L/bench.log
grep -E "^\|" $L/bench/*.md | head -60 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
