"""The benchmark commands end to end on the CPU with GPU timing replaced: tables, markers, ratios, files."""

import math
import sys

import pandas as pd
import pytest
import torch
from flashattn_bench import bench, features, pytorch_attention, tables, util
from flashattn_bench.implementations import FACTORIES, Implementation

# (speed factor, layout) of each fake implementation: fa4 takes (B, S, H, d) and no fp32, like the real one
FAKES = {"ours": (1.0, "bhsd"), "portable": (1.1, "bhsd"), "gluon": (0.8, "bhsd"),
         "gluon_bwd": (0.75, "bhsd"), "fa4": (0.7, "bshd"), "fa4_det": (0.9, "bshd"),
         "naive": (4.0, "bhsd"), "sdpa_flash": (1.5, "bhsd"), "sdpa_cudnn": (0.8, "bhsd")}  # fmt: skip


def _fake(name: str):
    def attend(q, k, v, is_causal):
        raise AssertionError("timed by fake_time_passes")

    attend.impl_name = name
    return attend


def fake_implementations(names):
    """The registry's entries with fake kernels (FlashAttention-4's built here: it need not import)."""
    fa4 = Implementation(None, "bshd", True, (torch.bfloat16, torch.float16), True)
    return {n: (fa4 if n.startswith("fa4") else FACTORIES[n]())._replace(attend=_fake(n)) for n in names}


@pytest.fixture
def fake_gpu(monkeypatch):
    """Timings that grow with the work, SDPA refusing fp32 like the real kernels, and 30 GiB free."""
    seen_layouts = {}

    def fake_time_passes(fn, q, k, v, causal, warmup_ms, rep_ms):
        name = fn.impl_name
        if name == "sdpa_flash" and q.dtype == torch.float32:
            raise RuntimeError("No available kernel. Aborting execution.")
        slow, layout = FAKES[name]
        batch, heads, seq, head_dim = (
            q.shape if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
        )
        seen_layouts.setdefault(name, set()).add((tuple(q.shape), tuple(k.shape)))
        base = batch * heads * seq**2 * head_dim * 1e-9
        return {"fwd": base * slow, "bwd": 2.5 * base * slow, "fwd+bwd": 3.5 * base * slow}

    monkeypatch.setattr(tables, "time_passes", fake_time_passes)
    monkeypatch.setattr(tables, "implementations", fake_implementations)
    monkeypatch.setattr(tables, "precompile", lambda variants, _: seen_layouts.update(precompiled=variants))
    monkeypatch.setattr(tables, "matmul_tflops", lambda: 795.0)
    monkeypatch.setattr(
        tables, "multihead_cases", lambda seqs: [((1, 4, 512, 64), 4, True), ((1, 4, 512, 64), 2, False)]
    )
    monkeypatch.setattr(util, "require_cuda", lambda command: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (30 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(tables.torch, "randn", lambda *shape, **kw: torch.empty(*shape, dtype=kw["dtype"]))
    return seen_layouts


def test_bench_writes_ratio_tables_and_marks_cells(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr("flashattn_bench.implementations.fa4_missing", lambda: None)  # as if installed
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
    assert fwd["sdpa_cudnn/ours"] == 0.8 and fwd["portable/ours"] == 1.1 and fwd["kv_heads"] == 4
    assert fwd["fa4/ours"] == 0.7 and fwd["fa4_det/ours"] == 0.9 and "gluon_bwd ms" not in multi
    full = multi[(multi["pass"] == "fwd") & ~multi["causal"]].iloc[0]
    assert full["kv_heads"] == 2 and math.isclose(full["ours TFLOP/s"], round(2 * expected, 1))
    assert (fp32["fa4 ms"] == "unsupported").all()
    # each in its own layout; grouped K/V for those that take it, expanded for SDPA
    assert ((1, 512, 4, 64), (1, 512, 2, 64)) in fake_gpu["fa4"]
    assert ((1, 4, 512, 64), (1, 2, 512, 64)) in fake_gpu["ours"]
    assert ((1, 4, 512, 64), (1, 4, 512, 64)) in fake_gpu["sdpa_cudnn"]
    assert not any(k[1] == 2 for _, k in fake_gpu["sdpa_cudnn"])
    # the multihead cases' (64, both masks) and the sweep's (32 causal, both dtypes) kernels, once each
    assert sorted(v[:3] for v in fake_gpu["precompiled"]) == [
        (32, "bf16", True), (32, "fp32", True), (64, "bf16", False), (64, "bf16", True)
    ]  # fmt: skip


def test_bench_skips_fa4_with_a_note_where_it_does_not_import(fake_gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import fails
    argv = ["bench", "--out", str(tmp_path), "--only", "multihead", "--impls", "ours", "fa4", "sdpa_cudnn"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fa4")]
    assert len(notes) == 1 and "skipped" in notes[0], notes
    multi = pd.read_csv(tmp_path / "multihead.csv")
    assert "fa4 ms" not in multi and "sdpa_cudnn/ours" in multi


def test_implementation_names_match_the_registry():
    assert set(bench.IMPLEMENTATION_NAMES) == set(FACTORIES)


def test_naive_memory_count_is_quadratic():
    one = tables.naive_bytes(1, 1, 1024, torch.bfloat16)
    assert tables.naive_bytes(1, 1, 2048, torch.bfloat16) == 4 * one
    assert tables.naive_bytes(2, 3, 1024, torch.bfloat16) == 6 * one
    assert pytorch_attention.SAVED_SCORE_TENSORS == 1


def test_feature_table_ratios_and_targets(monkeypatch):
    times = {"ours gqa 32/8": 10.0, "ours mha 32/32": 10.0, "sdpa_cudnn expanded 32/32": 9.0,
             "sdpa_flash expanded 32/32": 12.0, "ours d256 16 heads": 12.0, "sdpa_flash d256 16 heads": 11.0,
             "ours d128 32 heads": 10.0, "ours packed": 4.0, "sdpa best padded+mask": 20.0,
             "ours window 4096": 1.6, "ours window 4096 portable": 2.0,
             "ours causal 32768": 8.0, "ours full 32768": 16.0}  # fmt: skip
    fake = {k: ({"fwd": t, "bwd": 2.5 * t, "fwd+bwd": 3.5 * t}, 1e12) for k, t in times.items()}
    fake["sdpa best padded+mask backend"] = ("sdpa_efficient padded+mask", 0.0)
    monkeypatch.setattr(features, "_measurements", lambda args: fake)
    table = features.feature_table(None).set_index(["ours", "reference", "pass"])
    both = table.xs("fwd+bwd", level="pass")
    assert both.loc[("ours gqa 32/8", "ours mha 32/32"), "met"] == "yes"  # 1.0 <= 1.05
    assert both.loc[("ours d256 16 heads", "ours d128 32 heads"), "ratio"] == round(10 / 12, 3)
    assert both.loc[("ours window 4096 portable", "ours causal 32768"), "met"] == "no"  # 4x < 5x
    assert both.loc[("ours window 4096", "ours window 4096 portable"), "ratio"] == 1.25
    packed = both.loc[("ours packed", "sdpa best padded+mask (sdpa_efficient padded+mask)")]
    assert packed["ratio"] == 5.0 and packed["met"] == "yes"
    assert features.document_lengths() == features.document_lengths()
    lengths = features.document_lengths()
    assert len(lengths) == 8 and min(lengths) == 512 and max(lengths) == 8192
