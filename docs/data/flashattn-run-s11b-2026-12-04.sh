#!/usr/bin/env bash
# After run s11a: the leaderboard's attention probe at its real shapes with the kernels as they stand (which
# implementation the 8B step and large-8k take), then every GPU test outside the flashattn package
mkdir -p $OUT/logs; L=$OUT/logs
date -u +"start %F %T UTC"
timeout 200 python3 - > $L/probe.log 2>&1 <<'PY'
import json, torch
from leaderboard.attention import choose_attention
for shape in [(1, 32, 32768, 128), (2, 20, 8192, 64), (1, 32, 8192, 128)]:
    _, record = choose_attention("auto", shape, torch.bfloat16, torch.device("cuda"))
    print(json.dumps({"shape": shape, **record}), flush=True)
PY
echo "probe rc $?"; tail -4 $L/probe.log
date -u +"tests %F %T UTC"
timeout 280 python3 -m pytest -m gpu -q -p no:randomly -p no:cacheprovider tests apps/leaderboard/tests \
  packages/profiling/tests packages/basics/tests > $L/tests-other.log 2>&1
echo "other gpu tests rc $?" | tee -a $L/tests-other.log; tail -3 $L/tests-other.log
grep -E "FAILED|Error" $L/tests-other.log | head -10
date -u +"end %F %T UTC"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
