"""The Gluon forward compiles for sm90 on the CPU (no GPU): matrix instructions present, register moves
between its partitions, no spills, shared memory within a Hopper block's limit."""

import pytest
from flashattn.gluon_compile import VARIANTS, compile_sm90

SHARED_LIMIT = 232448  # bytes one Hopper thread block may opt into


@pytest.mark.parametrize(
    "head_dim, variant, causal", [(128, "default", True), (64, "no-overlap", False), (128, "pingpong", False)]
)
def test_gluon_forward_compiles_for_sm90_without_spills(head_dim, variant, causal):
    row = compile_sm90(head_dim, VARIANTS[variant], causal)
    assert row["wgmma"] > 0 and row["setmaxnreg"] > 0, row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["shared_bytes"] <= SHARED_LIMIT and row["registers"] > 0, row
