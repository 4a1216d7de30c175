#!/usr/bin/env bash
# Timing-only copies of the register-add kernel (made here, on the GPU machine; they race or lose dQ):
# which part of the register additions costs the time
mkdir -p $OUT/logs; L=$OUT/logs
F=packages/flashattn/src/flashattn/gluon_bwd5.py
bench() { timeout 120 python3 -m flashattn.hopper_bench --seqs 8192 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps --gluon-bwd-steps --gluon-bwd5-steps default register-adds --rep-ms 40 --out $L/bench-$1 > $L/bench-$1.log 2>&1
  echo "== $1"; grep -E "g5-|sdpa-cudnn" $L/bench-$1.md | grep bwd | cut -c1-90; }
bench full
sed -i 's/^    _wait_turn(turn_ptr, turn)$/    pass/' $F; bench no-wait
sed -i 's/_release_turn(_query_turn(.*)\[0\])/pass/' $F; bench no-wait-no-release
sed -i 's/^    _add_registers(dq, row, HALF)$/    pass/' $F; bench no-turns-no-reds
git diff --stat
cd $OUT && tar czf logs.tgz logs && rm -rf logs
