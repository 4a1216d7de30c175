#!/usr/bin/env bash
# After making the dense kernels' mask test compile-time again: the window and public-path tests, the Gluon forward's
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  -k "window or public" > $L/tests-window.log 2>&1; echo "window tests rc $?" | tee -a $L/tests-window.log; tail -1 $L/tests-window.log
timeout 150 python3 -m pytest -m gpu -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py \
  > $L/tests-gluon.log 2>&1; echo "gluon tests rc $?" | tee -a $L/tests-gluon.log; tail -1 $L/tests-gluon.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
