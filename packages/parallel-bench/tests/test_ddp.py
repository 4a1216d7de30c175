"""The DDP benchmark on CPU processes (tiny preset) and the trace reader behind its figure."""

import gzip
import json

import pandas as pd
import pytest
from harness.trace import load_trace
from parallel_bench import trace_plot


def _kernel(name, stream, start_us, dur_us, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": start_us, "dur": dur_us, "args": {"stream": stream}}


def _write_trace(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_overlap_is_the_share_of_communication_time_under_compute(tmp_path):
    # Compute busy 1000-11000 and 13000-20000 µs; NCCL 6000-16000 and 15000-17000 (overlapping each other):
    # communication busy 6000-17000 = 11 ms, of which 6000-11000 and 13000-17000 (9 ms) under compute.
    events = [
        _kernel("ampere_sgemm_128x64", 7, 1000, 4000),
        _kernel("elementwise_kernel", 7, 5000, 6000),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 21, 6000, 10000),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 21, 15000, 2000),
        _kernel("sm90_xmma_gemm", 7, 13000, 7000),
        _kernel("backward", 0, 4000, 16000, cat="gpu_user_annotation"),
        _kernel("forward", 0, 500, 3000, cat="user_annotation"),
        _kernel("ProfilerStep#1", 0, 0, 30000, cat="gpu_user_annotation"),
        {"ph": "i", "name": "instant", "ts": 1},
    ]
    df = trace_plot.gpu_intervals(load_trace(_write_trace(tmp_path / "t.json.gz", events)))
    assert set(df.loc[df["kind"] == "phase", "name"]) == {"backward", "forward"}
    assert df.loc[df["kind"] != "phase", "start_ms"].min() == 0.0
    s = trace_plot.summary(df)
    assert s["communication_ms"] == pytest.approx(11.0)
    assert s["compute_ms"] == pytest.approx(17.0)
    assert s["overlap"] == pytest.approx(9 / 11)
    summaries = trace_plot.plot_timelines({"a": tmp_path / "t.json.gz"}, tmp_path / "fig.png", title="t")
    assert summaries["a"]["overlap"] == pytest.approx(9 / 11)
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_trace_without_kernels_is_refused(tmp_path):
    path = _write_trace(tmp_path / "cpu.json.gz", [_kernel("aten::mm", 1, 0, 5, cat="cpu_op")])
    with pytest.raises(ValueError, match="no GPU kernels"):
        trace_plot.gpu_intervals(load_trace(path))


def test_benchmark_runs_every_variant_on_cpu_processes(tmp_path):
    pytest.importorskip("cs336_basics")
    pytest.importorskip("analysis.accounting")
    from parallel_bench import ddp

    df = ddp.main(
        [
            "--preset",
            "tiny",
            "--backend",
            "gloo",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--variants",
            "local",
            "naive",
            "flat",
            "ddp",
            "bucketed",
            "torch",
            "--sweep-mb",
            "0.01",
            "--out",
            str(tmp_path),
        ]
    )
    runs = pd.read_csv(tmp_path / "ddp.csv")
    assert len(runs) == 12 and set(runs["precision"]) == {"fp32", "bf16"}
    assert (runs["step_ms"] > 0).all() and (runs["step_min_ms"] <= runs["step_max_ms"]).all()
    assert (runs.loc[runs["variant"] == "torch", "vs_torch"] == 1.0).all()
    assert (runs.loc[runs["variant"] == "local", "comm_overhead_ms"] == 0.0).all()
    sweep = pd.read_csv(tmp_path / "ddp-sweep.csv")
    assert sorted(sweep.loc[sweep["variant"] == "bucketed", "bucket_mb"]) == [0.01, 25.0]
    assert (tmp_path / "figures" / "ddp-bucket-sweep.png").exists()
    assert len(df) == 13
    # The traced step was recorded (phases and operators), not cleared by a profiler schedule.
    events = load_trace(tmp_path / "ddp-trace-ddp-fp32.json.gz")
    names = {e.get("name") for e in events}
    assert {"forward", "backward", "finish_gradient_synchronization", "optimizer"} <= names
    assert any(e.get("cat") == "cpu_op" for e in events)
