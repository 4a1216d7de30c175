import pytest
import torch
from profiling.mixed_precision import accumulate, accumulation_table, autocast_dtypes


def test_accumulation_facts():
    table = accumulation_table().set_index("case")
    err = table["abs_error"]
    assert 0 < err["fp32 total, fp32 addends"] < 1e-3
    assert err["fp16 total, fp16 addends"] > 0.01  # fp16 spacing near 10 is 2**-7: many additions round
    assert err["fp32 total, fp16 addends"] == err["fp32 total, fp16 addends upcast"]
    # fp16 stores 0.01 as 0.010002136...: the error is the representation error times 1000
    stored = float(torch.tensor(0.01, dtype=torch.float16))
    assert table.loc["fp32 total, fp16 addends", "result"] == pytest.approx(1000 * stored, abs=1e-3)
    assert accumulate(torch.float64, torch.float64) == pytest.approx(10.0, abs=1e-12)


@pytest.mark.parametrize("dtype,low", [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
def test_autocast_dtypes_on_cpu(dtype, low):
    table = autocast_dtypes(dtype, "cpu")
    got = dict(zip(table["tensor"], table["dtype"], strict=True))
    assert got["parameters"] == "torch.float32" and got["gradients"] == "torch.float32"
    assert got["first linear output"] == low and got["logits"] == low
    assert got["loss"] == "torch.float32"


@pytest.mark.gpu
def test_autocast_keeps_layer_norm_in_fp32_on_cuda():
    got = dict(zip(*[autocast_dtypes("fp16", "cuda")[c] for c in ("tensor", "dtype")], strict=True))
    assert got["layer norm output"] == "torch.float32" and got["first linear output"] == "torch.float16"


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="dtype"):
        autocast_dtypes("fp8")
