"""CPU tests of which kernels a call takes (:func:`flashattn.dispatch.choose`, :func:`triton_kernels`): the
Hopper forward on sm90 for the shapes it covers, the portable kernels for everything else, and the reason.

No GPU is needed: the device query of :mod:`flashattn.hopper` is replaced by one that answers "sm90", and the
interpreter flag is set so that the Triton path accepts CPU tensors (nothing is launched here)."""

import pytest
import torch
from flashattn import dispatch, hopper
from flashattn.dispatch import choose, pinned_kernels, triton_kernels


def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


@pytest.fixture
def sm90(monkeypatch):
    """Pretend the CPU tensors sit on an sm90 GPU that the Triton path accepts."""
    monkeypatch.setattr(hopper, "device_reason", lambda device: None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # not the knob itself: setting it pins it for later tests


def test_capability_reason():
    assert hopper.capability_reason((9, 0)) is None
    for other in ((8, 0), (8, 9), (10, 0), (12, 0)):
        reason = hopper.capability_reason(other)
        assert reason is not None and str(other) in reason and "(9, 0)" in reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_covered_calls_take_the_faster_sm90_kernels(sm90, dtype, head_dim):
    q, kv = _t(2, 8, 97, head_dim, dtype=dtype), _t(2, 2, 1025, head_dim, dtype=dtype)  # GQA 8 / 2
    for causal in (True, False):
        choice = choose(q, kv, kv, causal)
        assert choice.name == "triton"
        backward = dispatch.HOPPER_BACKWARD[head_dim]
        assert (choice.forward, choice.backward) == (dispatch.HOPPER_FORWARD, backward)
        assert (
            f"{dispatch.HOPPER_FORWARD} forward" in choice.reason and f"{backward} backward" in choice.reason
        )
    q3 = _t(8, 17, head_dim, dtype=dtype)  # (heads, seq, d): a batch of one
    assert triton_kernels(q3, q3, q3, True)[:2] == (
        dispatch.HOPPER_FORWARD,
        dispatch.HOPPER_BACKWARD[head_dim],
    )


@pytest.mark.parametrize("causal, window", [(True, (64, 0)), (False, (300, 20)), (True, (0, 5))])
def test_sm90_windows_take_the_gluon_kernels(sm90, causal, window):
    q, kv = _t(1, 8, 1000, 128), _t(1, 2, 1025, 128)
    choice = choose(q, kv, kv, causal, window)
    assert (choice.forward, choice.backward) == ("gluon", "gluon"), choice.reason
    assert "windows" in choice.reason
    with pinned_kernels("gluon", "portable"):
        assert triton_kernels(q, kv, kv, causal, window)[:2] == ("gluon", "portable")


@pytest.mark.parametrize(
    "q, k, causal, window, varlen, expected",
    [
        (_t(1, 4, 80, 128), _t(1, 4, 64, 128), False, (16, 0), False, "without keys"),
        (_t(1, 4, 64, 128), _t(1, 4, 64, 128), False, None, True, "packed documents"),
        (
            _t(1, 4, 64, 128, dtype=torch.float32),
            _t(1, 4, 64, 128, dtype=torch.float32),
            True,
            None,
            False,
            "float32",
        ),
        (_t(1, 4, 64, 96), _t(1, 4, 64, 96), False, None, False, "head dims"),
        (_t(1, 4, 64, 256), _t(1, 4, 64, 256), True, None, False, "head dims"),
    ],
    ids=["window-without-keys", "varlen", "fp32", "d96", "d256"],
)
def test_uncovered_calls_take_portable_kernels(sm90, q, k, causal, window, varlen, expected):
    choice = choose(q, k, k, causal, window, varlen)
    assert choice.name == "triton" and (choice.forward, choice.backward) == ("portable", "portable")
    assert expected in choice.reason, choice.reason


def test_other_devices_take_portable_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # not the knob itself: setting it pins it for later tests
    q = _t(1, 4, 64, 128, dtype=torch.float16)
    choice = choose(q, q, q, True)  # the real device query: CPU tensors
    assert (choice.forward, choice.backward) == ("portable", "portable") and "CUDA" in choice.reason
    monkeypatch.setattr(hopper, "device_reason", lambda device: hopper.capability_reason((8, 0)))
    choice = choose(q, q, q, True)
    assert (choice.forward, choice.backward) == ("portable", "portable") and "(8, 0)" in choice.reason


def test_pinned_kernels(sm90):
    q = _t(1, 4, 64, 128)
    with pinned_kernels("hopper", "hopper"):
        assert triton_kernels(q, q, q, False)[:2] == ("hopper", "hopper")
        assert triton_kernels(q, q, q, False, window=(3, 3))[:2] == ("portable", "portable")
    with pinned_kernels("gluon", "gluon5"):
        assert triton_kernels(q, q, q, False, window=(3, 3))[:2] == ("gluon", "portable")
    with pinned_kernels("portable", "portable"):
        assert choose(q, q, q, True)[2:] == ("portable", "portable")
    assert triton_kernels(q, q, q, False)[:2] == (dispatch.HOPPER_FORWARD, dispatch.HOPPER_BACKWARD[128])
    assert set(dispatch.HOPPER_BACKWARD) == set(hopper.HEAD_DIMS)
    with pytest.raises(ValueError, match="backward must be one of"), pinned_kernels("hopper", "cudnn"):
        pass


def test_cpu_without_interpreter_falls_back_to_pytorch():
    q = _t(1, 2, 8, 64)
    choice = choose(q, q, q)
    assert choice.name == "pytorch" and choice[2:] == ("pytorch", "pytorch")
