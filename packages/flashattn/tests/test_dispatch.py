"""CPU tests of which kernels a call takes (:func:`flashattn.dispatch.plan`, :func:`choose`): the sm90 kernels
for the calls they cover on sm90, the portable kernels for everything else on CUDA (and under the
interpreter), the PyTorch version where neither runs, each with its reason.

No GPU is needed: the sm90 path's device query is replaced by one that answers as an sm90 GPU would, and the
portable path is told that its kernels run interpreted (nothing is launched here)."""

import pytest
import torch
from flashattn import dispatch
from flashattn.dispatch import choose, plan
from flashattn.portable import fwd
from flashattn.sm90 import launch as sm90


def _t(*shape, dtype=torch.float16):  # the interpreted kernels refuse bf16
    return torch.zeros(shape, dtype=dtype)


@pytest.fixture
def portable(monkeypatch):
    """Pretend the portable kernels run these CPU tensors (as under TRITON_INTERPRET=1)."""
    monkeypatch.setattr(fwd, "INTERPRETED", True)


@pytest.fixture
def sm90_gpu(monkeypatch, portable):
    """Pretend the CPU tensors sit on an sm90 GPU."""
    monkeypatch.setattr(sm90, "device_reason", lambda device: None)


def test_capability_reason():
    assert sm90.capability_reason((9, 0)) is None
    for other in ((8, 0), (8, 9), (10, 0), (12, 0)):
        reason = sm90.capability_reason(other)
        assert reason is not None and str(other) in reason and "(9, 0)" in reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_covered_calls_take_the_sm90_kernels(sm90_gpu, dtype, head_dim):
    q, kv = _t(2, 8, 97, head_dim, dtype=dtype), _t(2, 2, 1025, head_dim, dtype=dtype)  # GQA 8 / 2
    for causal in (True, False):
        assert plan(q, kv, kv, causal, None) == ("sm90", "sm90")
        choice = choose(q, kv, kv, causal)
        assert choice[:2] == ("sm90", "sm90") and choice.reason.startswith("sm90 kernels take")
    q3 = _t(8, 17, head_dim, dtype=dtype)  # (heads, seq, d): a batch of one
    assert choose(q3, q3, q3, True)[:2] == ("sm90", "sm90")


@pytest.mark.parametrize("causal, window", [(True, (64, 0)), (False, (300, 20)), (True, (0, 5))])
def test_sm90_windows_take_the_sm90_kernels(sm90_gpu, causal, window):
    q, kv = _t(1, 8, 1000, 128), _t(1, 2, 1025, 128)
    assert plan(q, kv, kv, causal, window) == ("sm90", "sm90")


@pytest.mark.parametrize(
    "q, k, causal, window, varlen, expected",
    [
        (_t(1, 4, 80, 128), _t(1, 4, 64, 128), False, (16, 0), False, "without keys"),
        (_t(64, 4, 128), _t(64, 4, 128), False, None, True, "packed documents"),
        (_t(1, 4, 64, 128, dtype=torch.float32), _t(1, 4, 64, 128, dtype=torch.float32), True, None, False,
         "float32"),
        (_t(1, 4, 64, 96), _t(1, 4, 64, 96), False, None, False, "head dim 96"),
        (_t(1, 4, 64, 256), _t(1, 4, 64, 256), True, None, False, "head dim 256"),
    ],
    ids=["window-without-keys", "varlen", "fp32", "d96", "d256"],
)  # fmt: skip
def test_uncovered_calls_take_portable_kernels(sm90_gpu, q, k, causal, window, varlen, expected):
    choice = choose(q, k, k, causal, window, varlen)
    assert choice[:2] == ("portable", "portable")
    assert expected in choice.reason and choice.reason.startswith("portable kernels take"), choice.reason


def test_other_gpus_take_portable_kernels(monkeypatch, portable):
    q = _t(1, 4, 64, 128, dtype=torch.float16)
    choice = choose(q, q, q, True)  # the real device query: CPU tensors
    assert choice[:2] == ("portable", "portable") and "CUDA" in choice.reason
    monkeypatch.setattr(sm90, "device_reason", lambda device: sm90.capability_reason((8, 9)))
    choice = choose(q, q, q, True)
    assert choice[:2] == ("portable", "portable") and "(8, 9)" in choice.reason


def test_cpu_without_interpreter_takes_pytorch(monkeypatch):
    monkeypatch.setattr(fwd, "INTERPRETED", False)
    q = _t(1, 2, 8, 64)
    choice = choose(q, q, q)
    assert choice[:2] == ("pytorch", "pytorch")
    assert "sm90:" in choice.reason and "portable:" in choice.reason and "CUDA" in choice.reason


def test_float64_takes_pytorch_everywhere(sm90_gpu):
    q = _t(1, 2, 8, 64, dtype=torch.float64)
    choice = choose(q, q, q)
    assert choice[:2] == ("pytorch", "pytorch") and "float64" in choice.reason


def test_order_is_the_registry():
    from flashattn.kernels import KERNELS

    assert set(dispatch.ORDER) == set(KERNELS) and dispatch.ORDER[-1] == "pytorch"
