#!/usr/bin/env bash
# the leaderboard's GPU tests of the fixed offload tier and the fused block pieces, then the
# proxy ablation (baseline, full step, offload tier, +-8 GiB headroom) planned with 32 GiB headroom
mkdir -p $OUT/logs $OUT/logs/proxy; L=$OUT/logs; t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 )) s" | tee -a $L/summary.txt; }
stamp tests
timeout 90 python3 -m pytest -m gpu -q -p no:randomly -p no:cacheprovider apps/leaderboard/tests/test_offload.py > $L/test-offload.log 2>&1; echo "offload tests rc $?" | tee -a $L/summary.txt
timeout 200 python3 -m pytest -m gpu -q -p no:randomly -p no:cacheprovider apps/leaderboard/tests/test_fused_block.py > $L/test-fused.log 2>&1; echo "fused tests rc $?" | tee -a $L/summary.txt
tail -3 $L/test-offload.log $L/test-fused.log
stamp proxy
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left python3 apps/leaderboard/train.py --preset proxy-8b --ablation ends --steps 2 --warmup 1 \
  --time-budget $(( left - 75 )) --set memory_headroom_gib=32 --json $L/proxy/run.json > $L/proxy/train.log 2>&1; echo "proxy rc $?" | tee -a $L/summary.txt
stamp end
tail -15 $L/proxy/train.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
