#!/usr/bin/env bash
# Gluon forward with three consumer warpgroups (d 64): GPU tests of the new variants, then the ablation at (4, 16, 4096, 64)
mkdir -p $OUT/logs; L=$OUT/logs
timeout 80 python3 -m pytest -q -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gluon_gpu.py -k "three" > $L/gluon-tests.log 2>&1; echo "gluon tests rc $?" | tee -a $L/gluon-tests.log
timeout 70 python3 -m flashattn.hopper_bench --head-dim 64 --batch 4 --heads 16 --seqs 4096 --causal both --fwd-steps --bwd-steps --bwd5-steps \
  --gluon-steps default three-consumers three-consumers-64 default three-consumers three-consumers-64 --rep-ms 100 --out $L/three > $L/three.log 2>&1; echo "bench rc $?" | tee -a $L/three.log
tail -2 $L/gluon-tests.log
grep -E "fwd (gluon|sdpa-cudnn)" $L/three.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
