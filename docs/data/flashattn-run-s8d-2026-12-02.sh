#!/usr/bin/env bash
# Nsight Compute of the forward at (1, 32, 8192, 128) bf16, causal and not: the Gluon forward against SDPA
# cuDNN's (launch shape, clocks, tensor-pipe and MUFU use, L2 and shared-memory throughput, stalls)
mkdir -p $OUT/logs; L=$OUT/logs
ncu --version > $L/ncu-version.log 2>&1
cat > /tmp/one.py <<'PY'
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashattn import hopper
impl, causal = sys.argv[1], sys.argv[2] == "causal"
q, k, v = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(3):
        if impl == "gluon":
            hopper.gluon_forward(q, k, v, causal)
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
PY
timeout 60 python3 - > $L/cudnn-kernel-names.log 2>&1 <<'PY'
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
q, k, v = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for causal in (False, True):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=160))
PY
cat $L/cudnn-kernel-names.log | cut -c1-200 | head -14
M="gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_bytes.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread"
for c in full causal; do for impl in gluon cudnn; do
  timeout 120 ncu --kernel-name regex:"gluon_fwd|fprop|sdpa|fmha|flash|attn" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    python3 /tmp/one.py $impl $c > $L/ncu-sections-$impl-$c.log 2>&1; echo "sections $impl $c rc $?" | tee -a $L/ncu-version.log
  timeout 60 ncu --kernel-name regex:"gluon_fwd|fprop|sdpa|fmha|flash|attn" --launch-skip 2 --launch-count 1 --metrics "$M" python3 /tmp/one.py $impl $c > $L/ncu-metrics-$impl-$c.log 2>&1
  echo "metrics $impl $c rc $?" | tee -a $L/ncu-version.log
done; done
for f in $L/ncu-metrics-*.log; do echo "== $f"; grep -E "^  [a-z_]+__|==PROF==|Error|  [A-Za-z_0-9]+.*\(" $f | cut -c1-160 | head -20; done
grep -hE "Shared Memory Configuration Size|Dynamic Shared|Registers Per|Block Size|Grid Size|Cluster|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A" $L/ncu-sections-*.log | cut -c1-120 | head -80
cd $OUT && tar czf logs.tgz logs && rm -rf logs
