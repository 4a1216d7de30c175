#!/usr/bin/env bash
# Nsight Compute on the two dK/dV kernels (four products; five, with the dQ parts) at (1, 32, 8192, 128) bf16 non-causal and causal
mkdir -p $OUT/logs; L=$OUT/logs
which ncu > $L/ncu.log 2>&1; ncu --version >> $L/ncu.log 2>&1
cat > /tmp/one.py <<'PY'
import sys, torch
from flashattn import hopper
causal = sys.argv[1] == "causal"
q, k, v, do = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o, lse = hopper.gluon_forward(q, k, v, causal)
for _ in range(2):
    hopper.gluon_backward(q, k, v, o, lse, do, causal)
    hopper.gluon_backward5(q, k, v, o, lse, do, causal)
torch.cuda.synchronize()
PY
for c in full causal; do
  timeout 150 ncu --kernel-name regex:"gluon_dkdv" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed_pipe_uniform.sum,lts__t_sectors_op_red.sum \
    python3 /tmp/one.py $c > $L/ncu-$c.log 2>&1; echo "ncu $c rc $?" | tee -a $L/ncu.log
done
cat $L/ncu.log; grep -E "gluon_dkdv|Tensor|Duration|Throughput|Stall|Warp Cycles|hmma|shared|Issued" $L/ncu-full.log | head -60
cd $OUT && tar czf logs.tgz logs && rm -rf logs
