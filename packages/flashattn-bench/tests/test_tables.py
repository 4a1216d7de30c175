"""The benchmark commands end to end on the CPU with GPU timing replaced: tables, markers, ratios, files."""

import math
import sys

import pandas as pd
import pytest
import torch
from flashattn import bench, bench_features, bench_pytorch_attention, benchutil
from flashattn import bench_tables as tables


@pytest.fixture
def fake_gpu(monkeypatch):
    """Timings that grow with the work, SDPA refusing fp32 like the real kernels, and 30 GiB free."""

    def fake_time_passes(fn, q, k, v, causal, warmup_ms, rep_ms):
        if fn is tables.IMPLEMENTATIONS["sdpa_flash"] and q.dtype == torch.float32:
            raise RuntimeError("No available kernel. Aborting execution.")
        base = q.shape[0] * q.shape[1] * q.shape[2] ** 2 * q.shape[3] * 1e-9
        slow = {
            "ours": 1.0,
            "portable": 1.1,
            "gluon": 0.8,
            "gluon_bwd": 0.75,
            "hopper": 0.9,
            "naive": 4.0,
            "sdpa_flash": 1.5,
            "sdpa_cudnn": 0.8,
        }[next(n for n, f in tables.IMPLEMENTATIONS.items() if f is fn)]
        return {"fwd": base * slow, "bwd": 2.5 * base * slow, "fwd+bwd": 3.5 * base * slow}

    monkeypatch.setattr(tables, "time_passes", fake_time_passes)
    monkeypatch.setattr(tables, "precompile", lambda variants, jobs, kernel_sets: [])
    monkeypatch.setattr(tables, "matmul_tflops", lambda: 795.0)
    monkeypatch.setattr(
        tables, "multihead_cases", lambda seqs: [((1, 4, 512, 64), 4, True), ((1, 4, 512, 64), 2, False)]
    )
    monkeypatch.setattr(benchutil, "require_cuda", lambda command: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (30 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(tables.torch, "randn", lambda *shape, **kw: torch.empty(*shape, dtype=kw["dtype"]))


def test_bench_writes_ratio_tables_and_marks_cells(fake_gpu, tmp_path, monkeypatch):
    pytest.importorskip("analysis", reason="the benchmark counts FLOPs with the optional analysis package")
    argv = [
        "bench",
        "--out",
        str(tmp_path),
        "--seqs",
        "128",
        "65536",
        "--head-dims",
        "32",
        "--dtypes",
        "bf16",
        "fp32",
        "--only",
        "multihead",
        "sweep",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    sweep = pd.read_csv(tmp_path / "sweep.csv")
    assert {"sweep.md", "multihead.md", "flashattn-bench.png", "sweep_cells.csv"} <= {
        p.name for p in tmp_path.iterdir()
    }
    assert len(sweep) == 2 * 2 * 3  # dtypes x seqs x passes
    long = sweep[sweep["seq"] == 65536]
    assert long["naive ms"].str.startswith("OOM").all(), (
        "naive needs ~36+ GiB of scores at 65536 > 0.9 x 30 GiB"
    )
    fp32 = sweep[sweep["dtype"] == "float32"]
    assert (fp32["sdpa_flash ms"] == "unsupported").all() and fp32["sdpa_flash/ours"].isna().all()
    ok = sweep[(sweep["seq"] == 128) & (sweep["dtype"] == "bfloat16")]
    assert ok["naive/ours"].tolist() == [4.0] * 3 and ok["sdpa_cudnn/ours"].tolist() == [0.8] * 3
    multi = pd.read_csv(tmp_path / "multihead.csv")
    fwd = multi[multi["pass"] == "fwd"].iloc[0]
    expected = 4 * 4 * 512 * 512 * 64 / 2 / (4 * 512**2 * 64 * 1e-9) / 1e9
    assert math.isclose(fwd["ours TFLOP/s"], round(expected, 1))
    assert math.isclose(fwd["ours % of matmul"], round(100 * fwd["ours TFLOP/s"] / 795.0, 1))
    assert fwd["hopper/ours"] == 0.9 and fwd["portable/ours"] == 1.1 and fwd["kv_heads"] == 4
    full = multi[(multi["pass"] == "fwd") & ~multi["causal"]].iloc[0]
    assert full["kv_heads"] == 2 and math.isclose(full["ours TFLOP/s"], round(2 * expected, 1))


def test_naive_memory_count_is_quadratic():
    one = tables.naive_bytes(1, 1, 1024, torch.bfloat16)
    assert tables.naive_bytes(1, 1, 2048, torch.bfloat16) == 4 * one
    assert tables.naive_bytes(2, 3, 1024, torch.bfloat16) == 6 * one
    assert bench_pytorch_attention.SAVED_SCORE_TENSORS == 1


def test_feature_table_ratios_and_targets(monkeypatch):
    pytest.importorskip("analysis", reason="the benchmark counts FLOPs with the optional analysis package")
    times = {"ours gqa 32/8": 10.0, "ours mha 32/32": 10.0, "sdpa_cudnn expanded 32/32": 9.0,
             "sdpa_flash expanded 32/32": 12.0, "ours d256 16 heads": 12.0, "sdpa_flash d256 16 heads": 11.0,
             "ours d128 32 heads": 10.0, "ours packed": 4.0, "sdpa best padded+mask": 20.0,
             "ours window 4096": 1.6, "ours window 4096 portable": 2.0,
             "ours causal 32768": 8.0, "ours full 32768": 16.0}  # fmt: skip
    fake = {k: ({"fwd": t, "bwd": 2.5 * t, "fwd+bwd": 3.5 * t}, 1e12) for k, t in times.items()}
    fake["sdpa best padded+mask backend"] = ("sdpa_efficient padded+mask", 0.0)
    monkeypatch.setattr(bench_features, "_measurements", lambda args: fake)
    table = bench_features.feature_table(None).set_index(["ours", "reference", "pass"])
    both = table.xs("fwd+bwd", level="pass")
    assert both.loc[("ours gqa 32/8", "ours mha 32/32"), "met"] == "yes"  # 1.0 <= 1.05
    assert both.loc[("ours d256 16 heads", "ours d128 32 heads"), "ratio"] == round(10 / 12, 3)
    assert both.loc[("ours window 4096 portable", "ours causal 32768"), "met"] == "no"  # 4x < 5x
    assert both.loc[("ours window 4096", "ours window 4096 portable"), "ratio"] == 1.25
    packed = both.loc[("ours packed", "sdpa best padded+mask (sdpa_efficient padded+mask)")]
    assert packed["ratio"] == 5.0 and packed["met"] == "yes"
    assert bench_features.document_lengths() == bench_features.document_lengths()
    lengths = bench_features.document_lengths()
    assert len(lengths) == 8 and min(lengths) == 512 and max(lengths) == 8192
