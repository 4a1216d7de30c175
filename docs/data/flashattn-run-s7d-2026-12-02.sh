#!/usr/bin/env bash
# Five-product adder warp: release the Q buffer of a slot once its half is read (new) against releasing both
# halves together (old, the committed kernel), alternating new, old, new, old; errors and repeats first
mkdir -p $OUT/logs; L=$OUT/logs
F=packages/flashattn/src/flashattn/gluon_bwd5.py
timeout 150 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward5 or five" > $L/tests.log 2>&1; echo "tests rc $?"; tail -1 $L/tests.log
bench() { timeout 110 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps --gluon-bwd-steps default --gluon-bwd5-steps default --rep-ms 60 --out $L/bench-$1 > $L/bench-$1.log 2>&1
  echo "== $1"; grep -E "g5-|gbwd-|sdpa-cudnn" $L/bench-$1.md | grep "| bwd" | cut -c1-80; }
bench new1
cp .device/gluon_bwd5_old.py $F; bench old1
cp .device/gluon_bwd5_new.py $F; bench new2
cp .device/gluon_bwd5_old.py $F; bench old2
cd $OUT && tar czf logs.tgz logs && rm -rf logs
