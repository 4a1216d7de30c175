#!/usr/bin/env bash
# precompile from an empty cache (it now also runs a GQA call per sm90 variant), then the d 64 causal public
# path timed alone (the forward+backward cell of run 10)
mkdir -p $OUT/logs; L=$OUT/logs
export TRITON_CACHE_DIR=$(mktemp -d)
timeout 200 python3 -m flashattn.precompile --head-dims 64 128 --dtypes bf16 fp16 --jobs 14 > $L/precompile.log 2>&1
echo "precompile rc $?"; tail -3 $L/precompile.log; grep -v " ok$" $L/precompile.log | head
timeout 150 python3 .device/s10c.py  # kept as docs/data/flashattn-d64-public-passes-2026-12-02.py.txt; 2>&1 | tee $L/d64-public.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
