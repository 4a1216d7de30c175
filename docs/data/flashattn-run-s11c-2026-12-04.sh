#!/usr/bin/env bash
# The windowed Gluon dK/dV kernel with one mask a band edge and no empty-walk test (spills 4 bytes at d 128,
# from 164): the window, public-path and backward GPU tests, the features GPU tests, then an A/B against the
# kernel before the change (git show fde4532:packages/flashattn/src/flashattn/gluon_bwd.py > .device/diag/gluon_bwd_old.py)
mkdir -p $OUT/logs; L=$OUT/logs
date -u +"start %F %T UTC"
timeout 200 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  packages/flashattn/tests/test_gpu_features.py -k "window or public or gluon_backward or features" > $L/tests-window.log 2>&1
echo "window tests rc $?" | tee -a $L/tests-window.log; tail -2 $L/tests-window.log; grep -E "FAILED|Error" $L/tests-window.log | head
date -u +"ab %F %T UTC"
timeout 240 python3 docs/data/flashattn-window-dkdv-ab-2026-12-04.py.txt > $L/window-dkdv-ab.log 2>&1
echo "ab rc $?"; cat $L/window-dkdv-ab.log
date -u +"end %F %T UTC"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
