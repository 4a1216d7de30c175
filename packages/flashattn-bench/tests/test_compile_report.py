"""The sm90 Gluon kernels compile for sm90 on the CPU (no GPU): matrix instructions present, register moves
between their partitions, no spills, shared memory within a Hopper block's limit."""

import pytest
from flashattn_bench.compile_report import VARIANTS, compile_sm90

SHARED_LIMIT = 232448  # bytes one Hopper thread block may opt into


@pytest.mark.parametrize("head_dim, variant, causal", [(128, "default", True), (64, "default", False),
                                                       (128, "persistent", False)])  # fmt: skip
def test_gluon_forward_compiles_for_sm90_without_spills(head_dim, variant, causal):
    row = compile_sm90(head_dim, VARIANTS[variant], causal)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0, row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT and row["registers"] > 0, row


@pytest.mark.parametrize("head_dim, causal", [(128, True), (64, False)])
def test_sliding_window_forward_compiles_for_sm90_without_spills(head_dim, causal):
    row = compile_sm90(head_dim, {}, causal, window=True)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0, row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT, row


WINDOW_CASES = [("dq", 128, False), ("dkdv", 128, True), ("dkdv", 64, False)]


@pytest.mark.parametrize("kernel, head_dim, causal", WINDOW_CASES)
def test_sliding_window_backward_kernels_compile_for_sm90(kernel, head_dim, causal):
    """The windowed dK/dV kernel at d 128 spills a few loop scalars (164 bytes); none may serialise."""
    row = compile_sm90(head_dim, {}, causal, kernel, window=True)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0 and not row["wgmma_serialized"], row
    assert row["spill_bytes"] <= (256 if (kernel, head_dim) == ("dkdv", 128) else 0), row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT, row


BACKWARD_CASES = [("dq", 128, True), ("dq", 64, False), ("dkdv", 128, True), ("dkdv", 64, False)]


@pytest.mark.parametrize("kernel, head_dim, causal", BACKWARD_CASES)
def test_gluon_backward_kernels_compile_for_sm90_without_spills(kernel, head_dim, causal):
    row = compile_sm90(head_dim, {}, causal, kernel)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0, row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT and row["registers"] > 0, row


def test_dkdv_query_tiles_below_a_warpgroup_are_refused_by_name():
    with pytest.raises(Exception, match="BLOCK_M must be a multiple of 64"):
        compile_sm90(128, {"block_m": 32}, True, "dkdv")


def test_command_writes_its_rows(tmp_path, monkeypatch, capsys):
    import sys

    import pandas as pd
    from flashattn_bench import compile_report

    argv = [
        "compile_report",
        "--kernels",
        "dq",
        "--head-dims",
        "64",
        "--causal",
        "no",
        "--out",
        str(tmp_path / "r"),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    compile_report.main()
    rows = pd.read_csv(tmp_path / "r.csv")
    assert len(rows) == 1 and rows.loc[0, "kernel"] == "dq" and rows.loc[0, "wgmma"] > 0
    assert (tmp_path / "r.md").exists() and capsys.readouterr().out.startswith("dq d=64 default causal=False")
