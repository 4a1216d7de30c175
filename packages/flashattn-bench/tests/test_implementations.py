"""The implementations the benchmarks time, on the CPU: kernel sets by name fall back to the public path's
plan where they cannot take a call, FlashAttention-4 is called in its own layout with its flags, and is
skipped with one line where it does not import; the host-time summary."""

import sys
import types

import pytest
import torch
from flashattn import ops
from flashattn_bench import host_time
from flashattn_bench.implementations import available, fa4, fa4_missing, implementations
from flashattn_bench.util import kernel_sets


@pytest.mark.parametrize(
    "forward, backward", [("sm90", "portable"), ("portable", "sm90"), ("pytorch", "pytorch")]
)
def test_kernel_sets_fall_back_to_the_plan_where_a_set_cannot_take_the_call(forward, backward, monkeypatch):
    """On the CPU (no interpreter) only the pytorch set takes a call: every named set falls back to it;
    the op gets the window as a list and the default scale."""
    seen = []

    def apply(q, k, v, is_causal, window, scale, forward_kernels, backward_kernels):
        seen.append((is_causal, window, scale, forward_kernels, backward_kernels))
        return q.clone(), None

    monkeypatch.setattr(ops, "attention", apply)
    q, k = torch.randn(2, 4, 37, 24), torch.randn(2, 2, 45, 24)
    o = kernel_sets(forward, backward, window=(7, 3))(q, k, k, True)
    assert torch.equal(o, q) and seen == [(True, [7, 3], 24**-0.5, "pytorch", "pytorch")]


def test_kernel_sets_refuse_an_unknown_name():
    with pytest.raises(ValueError, match="kernel set 'hopper'"):
        kernel_sets("hopper", "portable")


def test_fa4_is_called_on_its_layout_with_its_flags(monkeypatch):
    calls = []

    def flash_attn_func(q, k, v, causal=False, deterministic=False):
        calls.append((q.shape, k.shape, causal, deterministic))
        return q * 2, torch.zeros(q.shape[:-1])  # (out, lse), as some releases return

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    assert fa4_missing() is None
    impls = implementations(["fa4", "fa4_det"])
    assert impls["fa4"].layout == "bshd" and impls["fa4"].grouped and torch.float32 not in impls["fa4"].dtypes
    q, kv = torch.ones(1, 9, 4, 8), torch.ones(1, 9, 2, 8)
    assert torch.equal(impls["fa4_det"].attend(q, kv, kv, True), q * 2)
    assert torch.equal(fa4()(q, kv, kv, False), q * 2)
    assert calls == [(q.shape, kv.shape, True, True), (q.shape, kv.shape, False, False)]


def test_fa4_is_skipped_with_one_line_where_it_does_not_import(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    assert available(["ours", "fa4", "sdpa_cudnn", "fa4_det"]) == ["ours", "sdpa_cudnn"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("fa4, fa4_det skipped: flash_attn.cute does not import")
    assert available(["ours"]) == ["ours"] and capsys.readouterr().out == ""


def test_host_time_summary_and_arguments():
    stats = host_time.summary([float(t) for t in range(1, 102)])
    assert stats == {"median us": 51.0, "p10 us": pytest.approx(10.2), "p90 us": pytest.approx(91.8)}
    args = host_time.parse_args([])
    assert (args.shape, args.dtype, args.calls, args.impls) == ([1, 4, 128, 64], "bf16", 1000, ["ours"])
    with pytest.raises(SystemExit):
        host_time.parse_args(["--calls", "0"])
