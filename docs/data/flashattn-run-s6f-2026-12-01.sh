#!/usr/bin/env bash
# Stall reasons (Nsight Compute) of the four- and five-product dK/dV kernels at (1, 32, 8192, 128) bf16 non-causal
mkdir -p $OUT/logs; L=$OUT/logs
cat > /tmp/one.py <<'PY'
import torch
from flashattn import hopper
q, k, v, do = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
o, lse = hopper.gluon_forward(q, k, v, False)
for _ in range(2):
    hopper.gluon_backward(q, k, v, o, lse, do, False)
    hopper.gluon_backward5(q, k, v, o, lse, do, False)
torch.cuda.synchronize()
PY
timeout 200 ncu --kernel-name regex:"gluon_dkdv" --launch-skip 2 --launch-count 2 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__warps_active.avg.per_cycle_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_shared_ld.sum" \
  python3 /tmp/one.py > $L/ncu-stalls.log 2>&1; echo "ncu rc $?" | tee -a $L/ncu-stalls.log
grep -E "gluon_dkdv|stalled|conflicts|shared_st|shared_ld|hmma" $L/ncu-stalls.log | awk '{print $1, $NF}' | head -80
cd $OUT && tar czf logs.tgz logs && rm -rf logs
