#!/usr/bin/env bash
# After moving the dK/dV programs' shared pieces into one place: the GPU tests of both Gluon backwards again
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -q -x -n 12 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward or five or pinned" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
tail -2 $L/tests.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
