#!/usr/bin/env bash
# Gluon backward behind the public names at d 64 and 128: Hopper GPU tests, the d 128 ablation with each kernel alone, then the multihead table
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 150 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps --kernels \
  --gluon-bwd-steps default dkdv-no-overlap triton-dq --rep-ms 100 --out $L/gbwd128 > $L/gbwd128.log 2>&1; echo "ablation rc $?" | tee -a $L/gbwd128.log
timeout 200 python3 -m flashattn.bench --only multihead --multihead-seqs 8192 32768 \
  --impls ours portable hopper sdpa_flash sdpa_cudnn gluon gluon_bwd --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
tail -2 $L/tests.log; grep -E "FAIL|Error" $L/tests.log | head -10
grep -hE "(bwd|dq|dkdv) (gbwd|sdpa-cudnn|portable)" $L/gbwd128.log
grep -E "ours|sdpa_cudnn" $L/bench/multihead.md | head -3; tail -2 $L/bench.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
