"""The tests' error budgets: they pass what they should, fail what they should, and say why."""

import math

import numpy as np
import pytest
import torch
from harness.testing import assert_close, assert_error_budget, assert_relative_error, relative_error


def test_relative_error_is_the_norm_ratio_above_the_floor():
    gen = torch.Generator().manual_seed(0)
    expected = torch.randn(17, 5, generator=gen, dtype=torch.float64)
    actual = expected + 1e-3 * torch.randn(17, 5, generator=gen, dtype=torch.float64)
    want = ((actual - expected).norm() / expected.norm()).item()
    assert relative_error(actual, expected, floor=1e-3) == pytest.approx(want, rel=1e-12)
    assert relative_error(actual.float(), expected, floor=1e-3) == pytest.approx(want, rel=1e-4)


def test_zero_reference_is_measured_against_the_floor():
    """One key: the true dQ is exactly zero; a residue of 1e-7 per element is a tiny error, not 100%."""
    expected = torch.zeros(1, 16, dtype=torch.float64)
    actual = torch.full((1, 16), 1e-7)
    error = relative_error(actual, expected, floor=1.0)
    assert error == pytest.approx(1e-7, rel=1e-6)
    assert relative_error(actual, expected, floor=0.1) == pytest.approx(1e-6, rel=1e-6)


def test_numpy_arrays_and_scalars_of_one_element():
    assert relative_error(np.array([2.0]), np.array([1.0]), floor=1.0) == pytest.approx(1.0)
    assert relative_error(torch.tensor(3.0), torch.tensor(0.0), floor=2.0) == pytest.approx(1.5)


@pytest.mark.parametrize("floor", [0.0, -1.0, math.nan])
def test_floor_must_be_positive(floor):
    with pytest.raises(ValueError, match="floor must be > 0"):
        relative_error(torch.ones(3), torch.ones(3), floor=floor)


def test_shape_mismatch_is_an_error_not_a_broadcast():
    with pytest.raises(ValueError, match=r"shape \(3, 1\) differs from the reference's \(3,\)"):
        relative_error(torch.ones(3, 1), torch.ones(3), floor=1.0)
    with pytest.raises(ValueError, match="grad: shape"):
        assert_close(torch.ones(3, 1), torch.ones(3), rtol=0, atol=0, name="grad")


def test_assert_relative_error_names_the_quantity():
    expected = torch.ones(97)
    assert assert_relative_error(expected + 1e-6, expected, bound=1e-5, floor=1.0) < 1e-5
    with pytest.raises(AssertionError, match=r"dk: relative error 1\.000e-03 is not below 1\.0e-05"):
        assert_relative_error(expected + 1e-3, expected, bound=1e-5, floor=1.0, name="dk")
    with pytest.raises(AssertionError, match="dk: has NaN"):
        assert_relative_error(torch.full((3,), math.nan), torch.ones(3), bound=1.0, floor=1.0, name="dk")


def test_assert_close_compares_in_float64_with_both_tolerances():
    expected = torch.tensor([0.0, 1.0, 100.0], dtype=torch.float64)
    assert_close(expected.float() + torch.tensor([1e-7, 1e-6, 1e-4]), expected, rtol=2e-6, atol=2e-7)
    with pytest.raises(AssertionError, match="o: Tensor-likes are not close"):
        off = expected + torch.tensor([1e-6, 0, 0], dtype=torch.float64)
        assert_close(off, expected, rtol=1e-3, atol=1e-7, name="o")
    with pytest.raises(ValueError, match="rtol and atol must be >= 0"):
        assert_close(expected, expected, rtol=-1, atol=0)


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax written out by hand: a plain version with its own rounding, like a kernel's."""
    e = (x - x.max(dim=-1, keepdim=True).values).exp()
    return e / e.sum(dim=-1, keepdim=True)


def test_error_budget_passes_an_equally_accurate_version_and_fails_a_sloppy_one():
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randn(33, 97, generator=gen, dtype=torch.float64)
    expected = torch.softmax(x64, dim=-1)
    plain = torch.softmax(x64.half(), dim=-1)
    ours = _softmax_rows(x64.half().float()).half()
    error, plain_error = assert_error_budget(ours, plain, expected, floor=1e-2, slack=1e-3, name="p")
    assert 0 < plain_error < 1e-2 and error <= 2 * plain_error + 1e-3

    sloppy = (expected + 0.05 * torch.rand(33, 97, generator=gen, dtype=torch.float64)).half()
    with pytest.raises(AssertionError, match=r"p: relative error .* exceeds 2 x the plain version's"):
        assert_error_budget(sloppy, plain, expected, floor=1e-2, slack=1e-3, name="p")


def test_error_budget_slack_covers_an_exact_plain_version():
    expected = torch.zeros(4, 16, dtype=torch.float64)
    plain = torch.zeros(4, 16)
    residue = torch.full((4, 16), 3e-8)
    assert_error_budget(residue, plain, expected, floor=1.0, slack=1e-7)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_error_budget(residue, plain, expected, floor=1.0, slack=1e-8)
    with pytest.raises(AssertionError, match="has NaN"):
        assert_error_budget(torch.full((4, 16), math.inf), plain, expected, floor=1.0, slack=1.0)
