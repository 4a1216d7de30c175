#!/usr/bin/env bash
# The persistent Gluon forward (one program per SM striding the query tiles, outputs staged apart from the query
# rows): GPU tests of every forward variant and of the public path's windows after the forward's restructuring,
# then the forward timed against the kernel before it (prev), alternating
mkdir -p $OUT/logs; L=$OUT/logs
P=packages/flashattn/src/flashattn
mkdir -p .device/new && cp $P/{gluon_fwd.py,hopper.py,gluon_common.py,gluon_dq.py,hopper_tiles.py,gluon_compile.py} .device/new/
timeout 200 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py \
  packages/flashattn/tests/test_hopper_gpu.py -k "gluon_gpu or window or public" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log; tail -2 $L/tests.log
grep -E "FAILED|Error" $L/tests.log | head -10
bench() { cp .device/$1/*.py $P/
  timeout 90 python3 -m flashattn.hopper_bench --seqs 4096 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps \
    --gluon-bwd-steps --gluon-bwd5-steps --gluon-steps $3 --rep-ms 60 --out $L/fwd-$2 > $L/fwd-$2.log 2>&1; echo "$2 rc $?"; }
bench new new1 "default persistent"; bench prev prev1 default; bench new new2 "default persistent"; bench prev prev2 default
cp .device/new/*.py $P/
for f in $L/fwd-*.log; do echo "== $f"; grep -E " fwd (gluon-|sdpa-cudnn)" $f; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
