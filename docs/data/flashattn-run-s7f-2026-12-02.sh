#!/usr/bin/env bash
# The features benchmark with the window rows split (same-kernel target; the sm90 forward's gain), then the dense
# Gluon forward with the window plumbing (new) against the kernel before it (old), alternating
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m flashattn.bench --only features --out $L/features > $L/features.log 2>&1; echo "features rc $?" | tee -a $L/features.log
grep -E "^\| window " $L/features.log | cut -c1-170
P=packages/flashattn/src/flashattn
fwd() { for f in gluon_fwd.py hopper.py; do cp .device/$1/$f $P/$f; done
  timeout 100 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --bwd-steps --bwd5-steps --gluon-bwd-steps \
    --gluon-bwd5-steps --fwd-steps --gluon-steps default --rep-ms 60 --out $L/fwd-$2 > $L/fwd-$2.log 2>&1
  echo "== $2"; grep -E "gluon-default|sdpa-cudnn" $L/fwd-$2.md | grep "| fwd " | cut -c1-80; }
fwd new new1; fwd old old1; fwd new new2; fwd old old2
cp .device/new/gluon_fwd.py $P/; cp .device/new/hopper.py $P/
cd $OUT && tar czf logs.tgz logs && rm -rf logs
