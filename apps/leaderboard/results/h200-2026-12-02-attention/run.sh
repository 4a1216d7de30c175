#!/usr/bin/env bash
# The leaderboard's attention probe at the real shapes with today's kernels (the public path runs the Gluon
# forward and backward on sm90), then large-8k on one H200 with the probe's choice and with ours pinned
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 - > $L/probe.log 2>&1 <<'PY'
import json, torch
from leaderboard.attention import choose_attention
for shape in [(1, 32, 32768, 128), (2, 20, 8192, 64), (1, 32, 8192, 128)]:
    _, record = choose_attention("auto", shape, torch.bfloat16, torch.device("cuda"))
    print(json.dumps({"shape": shape, **record}), flush=True)
PY
echo "probe rc $?"; cat $L/probe.log | tail -4
for att in auto flashattn; do
  timeout 170 python3 apps/leaderboard/train.py --preset large-8k --ranks 1 --steps 4 --warmup 1 --set attention=$att \
    --json $L/large-8k-$att.json > $L/large-8k-$att.log 2>&1
  echo "large-8k $att rc $?"; tail -5 $L/large-8k-$att.log
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
