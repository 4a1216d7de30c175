#!/usr/bin/env bash
# With the Gluon backward behind the public names: every flashattn and leaderboard GPU test, the leaderboard's attention probe at its two real shapes, then the multihead table at every length
mkdir -p $OUT/logs; L=$OUT/logs
timeout 240 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_gpu.py packages/flashattn/tests/test_gpu_features.py packages/flashattn/tests/test_commands.py tests/test_packed_documents.py apps/leaderboard/tests/test_gpu.py > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 90 python3 -c "
import json, torch
from leaderboard.attention import choose_attention
for shape in [(1, 32, 32768, 128), (2, 20, 8192, 64)]:  # one rank of leaderboard-8b; large-8k on one GPU
    _, info = choose_attention('auto', shape, torch.bfloat16, torch.device('cuda'))
    print(shape, json.dumps(info), flush=True)
" > $L/probe.log 2>&1; echo "probe rc $?" | tee -a $L/probe.log
timeout 330 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 16384 32768 65536 \
  --impls ours portable hopper sdpa_flash sdpa_cudnn gluon --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench > $L/bench.log 2>&1; echo "bench rc $?" | tee -a $L/bench.log
tail -2 $L/tests.log; grep -E "FAIL|Error" $L/tests.log | head -10
cat $L/probe.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
