#!/usr/bin/env bash
# Five-product Gluon backward (deferred staging, now its default): GPU tests, the multihead table with a gluon5 column, and timing-only copies without the turns / without the additions
mkdir -p $OUT/logs; L=$OUT/logs
timeout 200 python3 -m pytest -q -x -n 8 -p no:randomly -p no:cacheprovider packages/flashattn/tests/test_hopper_gpu.py -k "gluon_backward or five or pinned" > $L/tests.log 2>&1; echo "tests rc $?" | tee -a $L/tests.log
timeout 240 python3 -m flashattn.bench --only multihead --multihead-seqs 4096 8192 16384 32768 65536 \
  --impls ours portable gluon5 sdpa_cudnn --rep-ms 100 --warmup-ms 10 --jobs 14 --out $L/bench-mh > $L/bench-mh.log 2>&1; echo "bench-mh rc $?" | tee -a $L/bench-mh.log
F=packages/flashattn/src/flashattn/gluon_bwd5.py; cp $F /tmp/kept.py
for diag in kept no-turns no-adds; do
  cp /tmp/kept.py $F
  python3 - "$diag" "$F" <<'PY'
import sys
diag, path = sys.argv[1:]
s = open(path).read()
turn = "        _wait_turn(turn_ptr, n_last - tile)\n"
adds = ("        for half in gl.static_range(2):\n            _reduce_add(desc_acc, [b, h, m0, half * (HEAD_DIM // 2)],\n"
        "                        _staging(q_smem, do_smem, slot, half))  # fmt: skip\n")
assert turn in s and adds in s
if diag != "kept":
    s = s.replace(turn, "")
if diag == "no-adds":
    s = s.replace(adds, "")
open(path, "w").write(s)
PY
  timeout 120 python3 -m flashattn.hopper_bench --seqs 8192 32768 --causal both --fwd-steps --bwd-steps --bwd5-steps --gluon-steps \
    --gluon-bwd-steps default --gluon-bwd5-steps default --rep-ms 40 --out $L/diag-$diag > $L/diag-$diag.log 2>&1; echo "diag $diag rc $?" | tee -a $L/diag-$diag.log
done
cp /tmp/kept.py $F
tail -2 $L/tests.log; grep -E "bwd" $L/bench-mh.md | head -30 | cut -c1-200
for diag in kept no-turns no-adds; do grep -E "g5-default|gbwd-default|sdpa-cudnn" $L/diag-$diag.md | grep bwd | sed "s/^/$diag /" | cut -c1-120; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
