"""Error budgets for tests: comparisons whose outcome does not depend on the machine.

Rounding differs from one CPU to the next (thread count, BLAS, vector width), so a test bounds how far a
result may be from an independent reference (float64 math, torch's own implementation) in terms that hold
everywhere:

- `assert_close`: elementwise, ``|actual - expected| <= atol + rtol * |expected|``, both tolerances stated;
- `relative_error` / `assert_relative_error`: one number for a whole tensor, ``||actual - expected||`` over
  ``||expected||``, with an absolute floor so that a reference that is (nearly) zero is not divided by ~0;
- `assert_error_budget`: a fast low-precision result may be at most ``factor`` (about 2) times as far from a
  float64 reference as a plain low-precision version of the same computation, plus a small slack.

Every comparison runs in float64, so a float32 or bfloat16 result is checked against a float64 reference
directly.
"""

import math

import numpy as np
import torch

ArrayLike = torch.Tensor | np.ndarray


def _float64(x: ArrayLike) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x
    return tensor.detach().to(device="cpu", dtype=torch.float64)


def _check_shapes(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    if actual.shape != expected.shape:
        raise ValueError(
            f"{name}: shape {tuple(actual.shape)} differs from the reference's {tuple(expected.shape)}"
        )


def assert_close(
    actual: ArrayLike, expected: ArrayLike, *, rtol: float, atol: float, name: str = "value"
) -> None:
    """Fail unless ``|actual - expected| <= atol + rtol * |expected|`` elementwise (compared in float64).

    Both tolerances are required: a relative one alone fails where the reference is zero.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    a, e = _float64(actual), _float64(expected)
    _check_shapes(a, e, name)
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def relative_error(actual: ArrayLike, expected: ArrayLike, *, floor: float) -> float:
    """``||actual - expected|| / max(||expected||, floor * sqrt(numel))``, Frobenius norms in float64.

    floor: the root-mean-square size per element, in the quantity's own units, below which the reference
    counts as zero; the error is then measured against ``floor`` instead. Pick the typical size of the
    quantity on healthy inputs (e.g. 1 for outputs of unit-variance data), not a tiny number like 1e-6.
    """
    if not floor > 0:
        raise ValueError(f"floor must be > 0 (the quantity's typical size per element), got {floor}")
    a, e = _float64(actual), _float64(expected)
    _check_shapes(a, e, "relative_error")
    scale = max(e.norm().item(), floor * math.sqrt(max(e.numel(), 1)))
    return (a - e).norm().item() / scale


def assert_relative_error(
    actual: ArrayLike, expected: ArrayLike, *, bound: float, floor: float, name: str = "value"
) -> float:
    """Fail unless `relative_error` (with `floor`) is below `bound`; returns the error."""
    if not torch.isfinite(_float64(actual)).all():
        raise AssertionError(f"{name}: has NaN or infinite elements")
    error = relative_error(actual, expected, floor=floor)
    if not error < bound:
        raise AssertionError(f"{name}: relative error {error:.3e} is not below {bound:.1e} (floor {floor:g})")
    return error


def assert_error_budget(
    actual: ArrayLike,
    plain: ArrayLike,
    expected: ArrayLike,
    *,
    floor: float,
    factor: float = 2.0,
    slack: float,
    name: str = "value",
) -> tuple[float, float]:
    """Fail unless ``relative_error(actual) <= factor * relative_error(plain) + slack`` against `expected`.

    actual: the result under test (e.g. a kernel in float16); plain: the same computation done the plain way
    in the same low precision; expected: a float64 reference from the same inputs. `slack` is the relative
    error tolerated even when the plain version happens to be exact (a few units of the low precision's
    rounding).
    Returns ``(error, plain_error)``.
    """
    if not torch.isfinite(_float64(actual)).all():
        raise AssertionError(f"{name}: has NaN or infinite elements")
    error = relative_error(actual, expected, floor=floor)
    plain_error = relative_error(plain, expected, floor=floor)
    if not error <= factor * plain_error + slack:
        raise AssertionError(
            f"{name}: relative error {error:.3e} exceeds {factor:g} x the plain version's {plain_error:.3e}"
            f" + {slack:.1e}"
        )
    return error, plain_error
