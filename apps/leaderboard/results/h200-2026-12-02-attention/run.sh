#!/usr/bin/env bash
# The leaderboard's attention probe at its real shapes (which kernel train.py picks), then large-8k on one GPU
# with the probe's choice and with flashattn pinned. From the repository root, on one GPU:
#   bash apps/leaderboard/results/h200-2026-12-02-attention/run.sh [DIR]   (default DIR: results/attention)
set -u
dir=${1:-results/attention}
mkdir -p "$dir"
python - > "$dir/probe.log" 2>&1 <<'PY'
import json, torch
from leaderboard.attention import choose_attention
for shape in [(1, 32, 32768, 128), (2, 20, 8192, 64), (1, 32, 8192, 128)]:
    _, record = choose_attention("auto", shape, torch.bfloat16, torch.device("cuda"))
    print(json.dumps({"shape": shape, **record}), flush=True)
PY
for attention in auto flashattn; do
  python apps/leaderboard/train.py --preset large-8k --ranks 1 --steps 4 --warmup 1 \
    --set model.attention=$attention --json "$dir/large-8k-$attention.json" > "$dir/large-8k-$attention.log" 2>&1
done
