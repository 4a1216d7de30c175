"""The Triton AdamW (run by Triton's interpreter on a CPU) against ``cs336_basics.AdamW`` over many steps."""

import importlib.util
from pathlib import Path

import pytest
import torch
from cs336_basics import AdamW


@pytest.fixture(scope="module")
def interpreted():
    """``leaderboard.fused_adamw`` loaded afresh under ``TRITON_INTERPRET=1`` (read at kernel definition)."""
    import leaderboard

    mp = pytest.MonkeyPatch()
    if not torch.cuda.is_available():
        mp.setenv("TRITON_INTERPRET", "1")
    path = Path(leaderboard.__file__).with_name("fused_adamw.py")
    spec = importlib.util.spec_from_file_location("leaderboard_fused_adamw_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    mp.undo()


def test_matches_reference_adamw_over_steps(interpreted):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(7)
    shapes = [(1,), (17,), (97, 3), (4096 + 130,)]  # the last spans two programs with a ragged tail
    ours = [torch.randn(s, generator=gen).to(device).requires_grad_() for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    kwargs = dict(lr=3e-3, betas=(0.85, 0.99), eps=1e-7, weight_decay=0.1)
    opt, ref_opt = interpreted.TritonAdamW(ours, **kwargs), AdamW(ref, **kwargs)
    for _ in range(6):
        grads = [torch.randn(s, generator=gen).to(device) for s in shapes]
        for p, q, g in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert not torch.equal(p.detach(), torch.zeros_like(p))


def test_rejects_non_fp32_state(interpreted):
    p = torch.zeros(5)
    with pytest.raises(ValueError, match="grad must be a contiguous fp32"):
        interpreted.adamw_update_(
            p,
            torch.zeros(5, dtype=torch.float64),
            torch.zeros(5),
            torch.zeros(5),
            1,
            1e-3,
            0.9,
            0.999,
            1e-8,
            0.0,
        )
    with pytest.raises(ValueError, match="learning rate"):
        interpreted.TritonAdamW([torch.zeros(2, requires_grad=True)], lr=-1.0)
