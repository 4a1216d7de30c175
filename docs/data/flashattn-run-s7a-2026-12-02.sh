#!/usr/bin/env bash
# Five-product backward with the dQ parts reduced from registers: correctness and repeats, then time
mkdir -p $OUT/logs; L=$OUT/logs
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $L/gpu.txt 2>&1
timeout 200 python3 .device/check7.py > $L/check.log 2>&1; echo "check rc $?" | tee -a $L/check.log
cat $L/check.log | tail -14
timeout 250 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps --gluon-bwd-steps default --gluon-bwd5-steps default register-adds --rep-ms 40 --out $L/bench > $L/bench.log 2>&1
echo "bench rc $?"; cat $L/bench.md 2>/dev/null | cut -c1-150 | head -40
timeout 100 python3 -m flashattn.hopper_bench --head-dim 64 --batch 4 --heads 16 --seqs 4096 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps --gluon-bwd-steps default --gluon-bwd5-steps default register-adds --rep-ms 40 --out $L/bench-d64 > $L/bench-d64.log 2>&1
echo "bench d64 rc $?"; cat $L/bench-d64.md 2>/dev/null | cut -c1-150 | head -20
cd $OUT && tar czf logs.tgz logs && rm -rf logs
