#!/usr/bin/env bash
# After the switch of windows to the Gluon backward: the window and public-path GPU tests, the benchmark's whole
# multihead list (public path against cuDNN, flash and the portable kernels, one run), then every Hopper GPU test
mkdir -p $OUT/logs; L=$OUT/logs
timeout 120 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  -k "window or public" > $L/tests-window.log 2>&1; echo "window tests rc $?" | tee -a $L/tests-window.log; tail -2 $L/tests-window.log
timeout 330 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 16384 32768 65536 \
  --impls ours portable sdpa_flash sdpa_cudnn --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1
echo "bench rc $?" | tee -a $L/bench.log
timeout 130 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/tests-hopper.log 2>&1; echo "hopper tests rc $?" | tee -a $L/tests-hopper.log; tail -2 $L/tests-hopper.log
grep -E "^\|" $L/bench/*.md | head -60 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
