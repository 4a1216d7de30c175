"""The Gluon kernels compile for sm90 on the CPU (no GPU): matrix instructions present, register moves
between their partitions, no spills, shared memory within a Hopper block's limit."""

import pytest
from flashattn.gluon_compile import VARIANTS, compile_sm90

SHARED_LIMIT = 232448  # bytes one Hopper thread block may opt into


@pytest.mark.parametrize(
    "head_dim, variant, causal",
    [(128, "default", True), (64, "no-overlap", False), (128, "pingpong", False), (128, "persistent", False)],
)
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


BACKWARD_CASES = [("dq", 128, True), ("dkdv", 128, True), ("dkdv", 64, False)]


@pytest.mark.parametrize("kernel, head_dim, causal", BACKWARD_CASES)
def test_gluon_backward_kernels_compile_for_sm90_without_spills(kernel, head_dim, causal):
    row = compile_sm90(head_dim, {}, causal, kernel)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0, row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT and row["registers"] > 0, row


@pytest.mark.parametrize("head_dim, causal", [(128, True), (64, False)])
def test_five_product_kernel_compiles_for_sm90_without_serialised_products(head_dim, causal):
    """Its consumers hold dK, dV, S, dP and a dQ half in 240 registers: a few loop scalars spill, but ptxas
    must not serialise the asynchronous products (as it does with the dQ products issued before the
    softmax at d 128)."""
    row = compile_sm90(head_dim, {}, causal, "dkdvdq")
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0 and not row["wgmma_serialized"], row
    assert row["spill_bytes"] <= 256, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT, row


def test_dkdv_query_tiles_below_a_warpgroup_are_refused_by_name():
    with pytest.raises(Exception, match="BLOCK_M must be a multiple of 64"):
        compile_sm90(128, {"block_m": 32}, True, "dkdv")
