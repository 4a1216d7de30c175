"""Checks that need CUDA: the allocator history and the CUDA kernel attribution (skipped without a GPU)."""

import pytest
from profiling.kernels import profile_config
from profiling.memory import build_timeline, record
from profiling.workload import Workload

pytestmark = pytest.mark.gpu


def test_recorded_timeline_matches_allocator_peak_and_phases(tiny):
    workload = Workload(tiny.with_(context_length=97), "train", device="cuda")
    try:
        rec = record(workload, steps=2)
    finally:
        workload.close()
    timeline = build_timeline(rec["snapshot"], rec["baseline_bytes"], rec["phases"])
    assert rec["status"] == "ok"
    assert {"forward", "backward", "optimizer_step"} <= set(timeline.phase)
    peak = timeline.active_bytes[timeline.peak_index]
    assert peak <= rec["peak_bytes"] and peak >= 0.9 * rec["peak_bytes"]


def test_attention_ranges_hold_only_their_own_kernels():
    kernels, summary = profile_config("tiny", 1024, "forward", "fp32", steps=2, warmup=1, device="cuda")
    softmax = kernels[kernels["range"] == "attention.softmax"]
    assert softmax["kernel"].str.contains("softmax", case=False).all()
    layers = 2
    assert softmax["calls_per_step"].sum() == layers
    forward = summary.set_index("range").loc["forward"]
    assert forward["gpu_ms_per_step"] <= forward["python_timer_step_ms"] * 1.05
