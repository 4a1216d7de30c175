#!/usr/bin/env bash
mkdir -p $OUT/logs; L=$OUT/logs
# .device/s9e.py is kept verbatim as docs/data/flashattn-public-host-time-2026-12-02.py.txt
timeout 150 python3 .device/s9e.py 2>&1 | tee $L/host-time.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
