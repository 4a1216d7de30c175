"""GPU tests of the public calls' options on each kernel set: ``softmax_scale`` and ``return_lse`` against a
float64 reference (sm90 and portable kernels, dense and packed), autocast casting as SDPA does, and packed
documents whose cumulative lengths are wrong (reported by a device-side assertion, never read out of
bounds; in a process of its own, since that assertion ends the process's use of the GPU)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from attention_oracle import allowed, cu
from flashattn import flash_attention, flash_attention_varlen, reference
from flashattn.dispatch import plan
from harness.testing import assert_error_budget

ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FLOOR = 1e-2  # outputs and gradients of unit-variance inputs are of order 0.1-1 per element


def _randn(shape, dtype, seed):
    return torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed), dtype=dtype)


def scaled_attention(q, k, v, causal, window, scale):
    """``o, lse`` with scores ``scale * q k^T`` (K/V heads repeated per group), in the inputs' dtype."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed(q.shape[-2], k.shape[-2], causal, window, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores.double(), dim=-1)


def _grads(fn, inputs, do):
    """``o, lse, dq, dk, dv`` of ``fn(*inputs) -> (o, lse)`` (``lse`` carries no gradient)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    o, lse = fn(*leaves)
    o.backward(do)
    return [o.detach(), lse.detach(), *(t.grad for t in leaves)]


SCALE_CASES = [  # kernels, (batch, heads, kv heads), seq_q, seq_k, head dim, causal, window, dtype
    ("sm90", (2, 4, 2), 300, 1025, 128, True, None, torch.bfloat16),
    ("sm90", (1, 4, 4), 1000, 1000, 64, False, (100, 50), torch.float16),
    ("portable", (2, 4, 2), 300, 1025, 80, True, None, torch.bfloat16),
    ("portable", (1, 2, 1), 777, 777, 96, False, (100, 50), torch.float32),
]


@pytest.mark.parametrize("scale", [0.05, 0.3])
@pytest.mark.parametrize("case", SCALE_CASES, ids=lambda c: f"{c[0]}-d{c[4]}-{c[7]}".replace("torch.", ""))
def test_softmax_scale_and_lse_against_float64(case, scale):
    """``o`` and the gradients within twice plain attention's error at the same scale; ``lse`` (fp32, of
    the scaled scores, natural log) within 2e-3 of float64's; the default scale is ``1 / sqrt(d)``."""
    kernels, (batch, hq, hkv), seq_q, seq_k, d, causal, window, dtype = case
    if kernels == "sm90" and not ON_SM90:
        pytest.skip("the sm90 kernels need a compute-capability 9.0 GPU")
    q, do = (_randn((batch, hq, seq_q, d), dtype, seed=i) for i in (0, 1))
    k, v = (_randn((batch, hkv, seq_k, d), dtype, seed=i) for i in (2, 3))
    assert plan(q, k, v, causal, window).forward == kernels
    gold = _grads(lambda *t: scaled_attention(*t, causal, window, scale), [t.double() for t in (q, k, v)],
                  do.double())  # fmt: skip
    plain = _grads(lambda *t: scaled_attention(*t, causal, window, scale), (q, k, v), do)
    ours = _grads(lambda *t: flash_attention(*t, causal, window, softmax_scale=scale, return_lse=True),
                  (q, k, v), do)  # fmt: skip
    assert ours[1].shape == q.shape[:-1] and ours[1].dtype == torch.float32
    torch.testing.assert_close(ours[1].double(), gold[1], atol=2e-3, rtol=0)
    slack = 1e-5 if dtype == torch.float32 else 1e-4  # fp32: tf32x3 dots, about fp32 accuracy
    for name, x, p, g in zip(("o", "dq", "dk", "dv"), ours[:1] + ours[2:], plain[:1] + plain[2:],
                             gold[:1] + gold[2:], strict=True):  # fmt: skip
        assert x.dtype == dtype, name
        assert_error_budget(x, p, g, floor=FLOOR, slack=slack, name=name)
    default = flash_attention(q, k, v, causal, window)
    assert torch.equal(default, flash_attention(q, k, v, causal, window, softmax_scale=1 / math.sqrt(d)))


@pytest.mark.parametrize("causal, window", [(True, None), (False, (40, 10))])
def test_packed_softmax_scale_and_lse_against_float64(causal, window):
    """Packed documents: ``lse (H_q, total_q)`` of each document's scaled scores; ``o`` and gradients within
    twice plain attention's error."""
    lengths, scale = [1, 33, 0, 300], 0.2
    total = sum(lengths)
    q, do = (_randn((total, 4, 64), torch.bfloat16, seed=i) for i in (0, 1))
    k, v = (_randn((total, 2, 64), torch.bfloat16, seed=i) for i in (2, 3))
    cu_seqlens = cu(lengths).cuda()

    def documents(q, k, v):
        outs, lses, start = [], [], 0
        for n in lengths:
            doc = [t[start : start + n].transpose(0, 1) for t in (q, k, v)]
            o, lse = scaled_attention(*doc, causal, window, scale)
            outs.append(o.transpose(0, 1))
            lses.append(lse)
            start += n
        return torch.cat(outs), torch.cat(lses, dim=-1)

    gold = _grads(documents, [t.double() for t in (q, k, v)], do.double())
    plain = _grads(documents, (q, k, v), do)

    def ours_fn(q, k, v):
        return flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, 300, 300, causal, window,
                                      softmax_scale=scale, return_lse=True)  # fmt: skip

    ours = _grads(ours_fn, (q, k, v), do)
    assert ours[1].shape == (4, total) and ours[1].dtype == torch.float32
    torch.testing.assert_close(ours[1].double(), gold[1], atol=2e-3, rtol=0)
    for name, x, p, g in zip(("o", "dq", "dk", "dv"), ours[:1] + ours[2:], plain[:1] + plain[2:],
                             gold[:1] + gold[2:], strict=True):  # fmt: skip
        assert_error_budget(x, p, g, floor=FLOOR, slack=1e-4, name=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_casts_as_sdpa(dtype):
    """fp32 inputs inside ``torch.autocast``: the output in the autocast dtype and fp32 gradients, as SDPA
    gives them; bitwise the call on inputs cast by hand; as close to float64 as SDPA (within twice)."""
    q, k, v, do = (_randn((2, 4, 300, 64), torch.float32, seed=i) for i in range(4))
    ours, sdpa = ([t.detach().clone().requires_grad_() for t in (q, k, v)] for _ in range(2))
    with torch.autocast("cuda", dtype=dtype):
        o = flash_attention(*ours, True)
        o_sdpa = F.scaled_dot_product_attention(*sdpa, is_causal=True)
    assert o.dtype == o_sdpa.dtype == dtype
    o.backward(do.to(dtype))
    o_sdpa.backward(do.to(dtype))
    assert all(t.grad.dtype == s.grad.dtype == torch.float32 for t, s in zip(ours, sdpa, strict=True))
    by_hand = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    o_hand = flash_attention(*by_hand, True)
    o_hand.backward(do.to(dtype))
    assert torch.equal(o, o_hand)
    assert all(torch.equal(t.grad, h.grad.float()) for t, h in zip(ours, by_hand, strict=True))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    gold, _ = reference(*leaves, True)
    gold.backward(do.to(dtype).double())
    for name, x, s, g in zip(("o", "dq", "dk", "dv"), (o, *(t.grad for t in ours)),
                             (o_sdpa, *(t.grad for t in sdpa)), (gold, *(t.grad for t in leaves)),
                             strict=True):  # fmt: skip
        assert_error_budget(x, s, g, floor=FLOOR, slack=1e-4, name=name)


def test_autocast_packed_documents_return_the_autocast_dtype():
    lengths = [5, 0, 97]
    q, k, v = (_randn((sum(lengths), 2, 32), torch.float32, seed=i) for i in range(3))
    cu_seqlens = cu(lengths).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        o = flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, 97, 97, True)
    by_hand = flash_attention_varlen(*(t.bfloat16() for t in (q, k, v)), cu_seqlens, cu_seqlens, 97, 97, True)
    assert o.dtype == torch.bfloat16 and torch.equal(o, by_hand)


@pytest.mark.timeout(300)
def test_wrong_cu_seqlens_assert_on_the_device_and_never_read_out_of_bounds():
    """Run by ``varlen_bad_lengths.py`` in a process of its own: with the check switched off the kernels
    attend the clamped documents (outputs and gradients as the oracle's, no NaN from the guard rows around
    the packed tensors); with it on, the call returns without a host sync and the next synchronisation
    raises the device-side assertion."""
    script = Path(__file__).with_name("varlen_bad_lengths.py")
    env = {name: value for name, value in os.environ.items() if name != "CUDA_LAUNCH_BLOCKING"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=240)
    lines = done.stdout.strip().splitlines()
    assert lines, f"no result (exit {done.returncode}): {done.stderr[-4000:]}"
    result = json.loads(lines[-1])
    clamped, asserted = result["clamped"], result["asserted"]
    assert all(clamped["finite"].values()), clamped
    assert all(error < 2e-2 for error in clamped["errors"].values()), clamped
    assert asserted["call"] == "returned", asserted
    assert "device-side assert" in asserted["synchronize"], asserted
