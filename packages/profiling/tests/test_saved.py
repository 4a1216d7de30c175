import pytest
from analysis.accounting import block_activation_bytes, block_parameter_count
from profiling.saved_tensors import PARAMETERS, block_report


def test_block_saved_bytes_match_hooks_and_formula(tiny):
    report = block_report(tiny, "fp32", "cpu")
    table = report["table"]
    assert report["saved_hooks_MiB"] == pytest.approx(report["saved_graph_MiB"], rel=1e-4)
    expected = block_activation_bytes(tiny, tiny.batch_size, tiny.context_length) / 2**20
    assert report["saved_hooks_MiB"] == pytest.approx(expected, rel=1e-3)
    assert report["grad_MiB"] == pytest.approx(4 * block_parameter_count(tiny) / 2**20)
    assert table.loc[table["op"] != PARAMETERS, "share_pct"].sum() == pytest.approx(100)
    assert table.loc[table["op"] == PARAMETERS, "MiB"].item() == pytest.approx(report["grad_MiB"])
    softmax = table[table["op"] == "Softmax"]
    heads, seq, batch = tiny.num_heads, tiny.context_length, tiny.batch_size
    assert softmax["MiB"].item() * 2**20 == batch * heads * seq * seq * 4


def test_bf16_autocast_saves_less(tiny):
    bf16, fp32 = (block_report(tiny, d, "cpu")["saved_hooks_MiB"] for d in ("bf16", "fp32"))
    assert bf16 < fp32


def test_bad_dtype_is_named(tiny):
    with pytest.raises(ValueError, match="dtype"):
        block_report(tiny, "int8", "cpu")
