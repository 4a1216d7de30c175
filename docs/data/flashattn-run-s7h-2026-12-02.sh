#!/usr/bin/env bash
# The windowed Gluon backward: the window tests (public path, kernels, repeats, keys no query sees), and the dense
# Gluon backwards' error, repeat and five-against-seven tests (their shared helpers changed)
mkdir -p $OUT/logs; L=$OUT/logs
timeout 125 python3 -m pytest -m gpu -q -n 14 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py \
  -k "window or public or (bfloat16 and gluon_backward and error_within) or (repeat_runs and gluon_backward) or five_product" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log; grep -E "passed|failed|FAILED|Error" $L/tests.log | tail -n 12
cd $OUT && tar czf logs.tgz logs && rm -rf logs
