#!/usr/bin/env bash
# Gluon forward with the scale folded into the exponent's FMA: GPU tests of every variant, then A/B against the previous kernel
mkdir -p $OUT/logs; L=$OUT/logs
timeout 150 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py packages/flashattn/tests/test_hopper_gpu.py -k "gluon or public" > $L/gluon-tests.log 2>&1; echo "gluon tests rc $?" | tee -a $L/gluon-tests.log
timeout 200 python3 .device/fold_ab.py > $L/fold-ab.csv 2> $L/fold-ab.err; echo "ab rc $?" | tee -a $L/fold-ab.err
tail -2 $L/gluon-tests.log; tail -3 $L/fold-ab.err
cat $L/fold-ab.csv
cd $OUT && tar czf logs.tgz logs && rm -rf logs
