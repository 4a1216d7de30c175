"""Checks that need CUDA: the allocator history and the CUDA kernel attribution (skipped without a GPU)."""

import pytest
from profiling.kernel_attribution import profile_config
from profiling.memory_timeline import build_timeline, record
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


def test_phases_hold_no_more_kernel_time_than_the_step():
    """small at context 2048, full step: the configuration where per-operator kernel lists had the
    optimizer step hold more kernel time than the whole step; each kernel must now count once."""
    _, summary = profile_config("small", 2048, "train", "fp32", steps=2, warmup=1, device="cuda")
    ranges = summary.set_index("range")
    step_ms = ranges["python_timer_step_ms"].iloc[0]
    phases = ranges.loc[["forward", "backward", "optimizer_step"], "gpu_ms_per_step"]
    assert phases.sum() <= 1.05 * step_ms
    outside = ranges["gpu_ms_per_step"].get("(outside ranges)", 0.0)
    assert outside <= 0.02 * phases.sum()  # nearly every kernel was paired with its launch call
