#!/usr/bin/env bash
# The Gluon kernels' work order in head groups, longest-first inside each group (new) against head-major (prev):
# GPU tests of the Gluon kernels and the public path, then forward (default, persistent) and the Gluon backward
# (and each of its kernels) timed, prev and new alternating, SDPA cuDNN alongside
mkdir -p $OUT/logs; L=$OUT/logs
P=packages/flashattn/src/flashattn
timeout 200 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_hopper_gpu.py -k "gluon or window or public" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log; tail -2 $L/tests.log
grep -E "FAILED|Error" $L/tests.log | head -10
A="--fwd-steps --bwd-steps --bwd5-steps --gluon-bwd5-steps --gluon-steps default persistent --gluon-bwd-steps default --kernels --rep-ms 40"
bench() { cp .device/$1/*.py $P/
  timeout 100 python3 -m flashattn.hopper_bench --seqs 4096 8192 16384 32768 --causal both $A --out $L/d128-$2 > $L/d128-$2.log 2>&1; echo "d128 $2 rc $?"
  timeout 50 python3 -m flashattn.hopper_bench --batch 4 --heads 16 --head-dim 64 --seqs 4096 --causal both $A --out $L/d64a-$2 > $L/d64a-$2.log 2>&1; echo "d64a $2 rc $?"
  timeout 50 python3 -m flashattn.hopper_bench --heads 32 --kv-heads 8 --seqs 8192 --causal yes $A --out $L/gqa-$2 > $L/gqa-$2.log 2>&1; echo "gqa $2 rc $?"; }
bench new new1; bench prev prev1; bench new new2; bench prev prev2
cp .device/new/*.py $P/
python3 - $L <<'PY'
import sys, glob, pandas as pd
rows = []
for f in glob.glob(sys.argv[1] + "/*-*.csv"):
    shape, run = f.split("/")[-1][:-4].split("-", 1)
    t = pd.read_csv(f); t = t[t.step.isin(["sdpa-cudnn", "gluon-default", "gluon-persistent", "gbwd-default"])]
    t["shape"], t["run"] = shape, run; rows.append(t)
t = pd.concat(rows)
p = t.pivot_table(index=["shape", "seq", "causal", "pass", "step"], columns="run", values="ms")
print(p.round(3).to_string())
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs
