#!/usr/bin/env bash
# Every GPU test of the Hopper path (both Gluon backwards, the Triton-language ones, the public path) and a cold precompile with the gluon5 kernel set
mkdir -p $OUT/logs; L=$OUT/logs
export TRITON_CACHE_DIR=/tmp/cold-cache; rm -rf $TRITON_CACHE_DIR
( time timeout 200 python3 -m flashattn.precompile --head-dims 64 128 --dtypes bf16 fp16 --jobs 14 ) > $L/precompile.log 2>&1; echo "precompile rc $?" | tee -a $L/precompile.log
timeout 300 python3 -m pytest -q -n 12 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py packages/flashattn/tests/test_hopper_gluon_gpu.py > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
tail -4 $L/precompile.log; tail -3 $L/tests.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
