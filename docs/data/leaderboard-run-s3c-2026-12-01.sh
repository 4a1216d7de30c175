#!/usr/bin/env bash
# the leaderboard GPU tests after the ln1 / offload fixes, the proxy ablation again (32 GiB
# headroom), and the split dK/dV candidates at d 256 against the fused one
mkdir -p $OUT/logs/proxy $OUT/logs/tune; L=$OUT/logs; t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 )) s" | tee -a $L/summary.txt; }
stamp tests
timeout 150 python3 -m pytest -m gpu -q -p no:randomly -p no:cacheprovider apps/leaderboard/tests/test_offload.py \
  apps/leaderboard/tests/test_fused_block.py > $L/test-leaderboard.log 2>&1; echo "leaderboard tests rc $?" | tee -a $L/summary.txt
tail -3 $L/test-leaderboard.log
stamp proxy
timeout 200 python3 apps/leaderboard/train.py --preset proxy-8b --ablation ends --steps 2 --warmup 1 \
  --time-budget 150 --set memory_headroom_gib=32 --json $L/proxy/run.json > $L/proxy/train.log 2>&1; echo "proxy rc $?" | tee -a $L/summary.txt
stamp tune
timeout 100 python3 -m flashattn.tune --seq 8192 --heads 16 --head-dim 256 --dtype bf16 --kernels dkdv dk dv \
  --rep-ms 30 --jobs 16 --out $L/tune > $L/tune/tune.log 2>&1; echo "tune rc $?" | tee -a $L/summary.txt
stamp end
grep -E "^\|" $L/proxy/train.log | cut -c1-60,120-200 | head -8; grep -iE "median step|peak" $L/proxy/train.log | tail -2; tail -12 $L/tune/tune.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
