"""The fused LM head + cross-entropy against float64 ``F.cross_entropy`` of the materialized logits."""

import pytest
import torch
import torch.nn.functional as F
from harness.testing import assert_error_budget, assert_relative_error
from leaderboard.fused_cross_entropy import linear_cross_entropy


def _reference(hidden, weight, targets):
    """Loss and gradients in float64 through the plain logits."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy((h @ w.t()).flatten(0, -2), targets.flatten())
    loss.backward()
    return loss.detach(), h.grad, w.grad


# Relative errors count a reference below 1e-8 per element as zero; gradients of a mean loss over these
# sizes are far larger (RMS 6e-4 and up), so the floor only guards against dividing by zero.
FLOOR = 1e-8


@pytest.mark.parametrize(
    ("shape", "vocab", "d", "chunk"),
    [((1,), 97, 17, 1), ((17,), 130, 33, 7), ((2, 97), 503, 64, 64), ((3, 43), 257, 24, 1000)],
)
def test_matches_float64_logits(shape, vocab, d, chunk):
    gen = torch.Generator().manual_seed(sum(shape) + vocab)
    hidden = torch.randn(*shape, d, generator=gen, dtype=torch.float32, requires_grad=True)
    weight = (torch.randn(vocab, d, generator=gen) / d**0.5).requires_grad_()
    targets = torch.randint(0, vocab, shape, generator=gen)
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk)
    (2.5 * loss).backward()
    ref_loss, ref_dh, ref_dw = _reference(hidden, weight, targets)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert abs(loss.item() - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    assert_relative_error(hidden.grad, 2.5 * ref_dh, bound=1e-5, floor=FLOOR, name="dhidden")
    assert_relative_error(weight.grad, 2.5 * ref_dw, bound=1e-5, floor=FLOOR, name="dweight")


def test_bf16_error_within_twice_plain_bf16():
    """In bf16 the fused loss is no less accurate than bf16 logits fed to F.cross_entropy."""
    gen = torch.Generator().manual_seed(3)
    tokens, vocab, d = 130, 1031, 96
    hidden32 = torch.randn(tokens, d, generator=gen) * 3
    weight32 = torch.randn(vocab, d, generator=gen) / d**0.5
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    ref_loss, ref_dh, ref_dw = _reference(hidden32, weight32, targets)

    h, w = (t.bfloat16().requires_grad_() for t in (hidden32, weight32))
    fused = linear_cross_entropy(h, w, targets, chunk_tokens=17)
    fused.backward()
    hp, wp = (t.bfloat16().requires_grad_() for t in (hidden32, weight32))
    plain = F.cross_entropy((hp @ wp.t()).float(), targets)
    plain.backward()

    assert abs(fused.item() - float(ref_loss)) <= 2 * abs(plain.item() - float(ref_loss)) + 1e-3
    assert_error_budget(h.grad, hp.grad, ref_dh, floor=FLOOR, slack=1e-3, name="dhidden")
    assert_error_budget(w.grad, wp.grad, ref_dw, floor=FLOOR, slack=1e-3, name="dweight")


def test_large_logits_stay_finite():
    hidden = torch.full((5, 4), 50.0)
    weight = torch.randn(11, 4, generator=torch.Generator().manual_seed(0)) * 40
    targets = torch.arange(5)
    loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=2)
    assert torch.isfinite(loss)
    assert abs(float(loss) - float(_reference(hidden, weight, targets)[0])) < 1e-3 * max(1.0, float(loss))


def test_bad_inputs_name_the_argument():
    h, w, t = torch.randn(4, 8), torch.randn(10, 8), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(h, torch.randn(10, 7), t)
    with pytest.raises(ValueError, match="targets shape"):
        linear_cross_entropy(h, w, t[:3])
    with pytest.raises(ValueError, match="integer"):
        linear_cross_entropy(h, w, t.float())
    with pytest.raises(ValueError, match="share a dtype"):
        linear_cross_entropy(h, w.double(), t)
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_cross_entropy(h, w, t, chunk_tokens=0)


def test_compiled_epilogue_matches_eager():
    """The torch.compile'd chunk epilogue (used on CUDA) computes what the eager one does."""
    from leaderboard.fused_cross_entropy import _compiled_chunk_loss_and_grad, chunk_loss_and_grad

    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(37, 1031, generator=gen) * 4).bfloat16()
    targets = torch.randint(0, 1031, (37,), generator=gen)
    loss, grad = chunk_loss_and_grad(logits, targets, 1 / 97)
    compiled_loss, compiled_grad = _compiled_chunk_loss_and_grad(logits, targets, 1 / 97)
    assert grad.dtype == compiled_grad.dtype == torch.bfloat16
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_grad.float(), grad.float(), rtol=1e-2, atol=1e-5)
    ref = F.cross_entropy(logits.double(), targets, reduction="sum")
    assert abs(loss.item() - ref.item()) < 1e-4 * ref.item()
