"""GPU tests of the sm90 path (:mod:`flashattn.sm90`, the Gluon kernels): error within twice PyTorch's own
low-precision attention against a float64 reference, poisoned outputs, bitwise-identical repeats, GQA,
strided inputs, windows, ``lse`` shared with the portable kernels (either backward after either forward),
and the public entry points running these kernels. Errors: ||x - gold|| / ||gold||."""

import math

import pytest
import torch
from attention_oracle import allowed, attention
from flashattn import flash_attention, ops, reference
from flashattn.dispatch import Plan, choose, plan
from flashattn.kernels import KERNELS
from flashattn.sm90 import launch
from flashattn.triton_flash import FlashAttention2Triton

ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_SM90, reason="needs a compute-capability 9.0 GPU")]

CASES = [  # batch, heads_q, heads_kv, seq_q, seq_k, head_dim, causal
    (2, 3, 3, 1, 1, 64, True),
    (1, 2, 2, 17, 17, 128, True),
    (2, 2, 1, 97, 97, 64, False),
    (1, 4, 4, 1000, 1000, 128, True),
    (1, 2, 2, 1025, 1025, 64, True),
    (1, 2, 2, 4097, 4097, 128, True),
    (1, 2, 2, 4097, 4097, 128, False),
    (2, 2, 2, 300, 1025, 128, True),
    (1, 3, 3, 513, 130, 64, False),
    (1, 32, 8, 1000, 1000, 128, True),
    (1, 32, 4, 257, 1025, 64, True),
    (1, 32, 4, 1025, 97, 128, False),
    (2, 6, 2, 1100, 1100, 128, True),  # causal GQA over two batches: dK/dV programs longest-first overall
]
DTYPES = [torch.bfloat16, torch.float16]
NAMES = ("o", "lse", "dq", "dk", "dv")


def _rel_err(x, gold):
    """Relative error, floored at an RMS of 1e-2 where the gold value is (near) zero, e.g. dq at one key."""
    return ((x.double() - gold).norm() / gold.norm().clamp_min(1e-2 * gold.numel() ** 0.5)).item()


def _poison_allocator(nbytes: int) -> None:
    """Fill memory the caching allocator hands out next with NaN, so unwritten outputs show up."""
    junk = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del junk


def _inputs(case, dtype, seed):
    batch, heads, heads_kv, seq_q, seq_k, dim, _ = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (
        torch.randn(batch, heads, seq_q, dim, device="cuda", generator=gen, dtype=dtype) for _ in range(2)
    )
    k, v = (
        torch.randn(batch, heads_kv, seq_k, dim, device="cuda", generator=gen, dtype=dtype) for _ in range(2)
    )
    return q, k, v, do


def _scale(q) -> float:
    return 1 / math.sqrt(q.shape[-1])


def _plain(q, k, v, do, causal):
    """``o, lse, dq, dk, dv`` of plain attention in the inputs' dtype (K/V heads expanded for GQA)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    o, lse = reference(leaves[0], *(t.repeat_interleave(group, dim=1) for t in leaves[1:]), causal)
    o.backward(do)
    return [o.detach(), lse.detach(), *(t.grad for t in leaves)]


def _sm90(q, k, v, do, causal, window=None, **tiles):
    """``o, lse, dq, dk, dv`` of the sm90 launchers (``tiles``: ``dq_tile``, ``dkdv_tile``)."""
    o, lse = launch.forward(q, k, v, causal, window, _scale(q))
    return [o, lse, *launch.backward(q, k, v, o, lse, do, causal, window, _scale(q), **tiles)]


def _assert_within_budget(ours, plain, gold, dtype):
    for name, x, p, g in zip(NAMES, ours, plain, gold, strict=True):
        assert x.shape == g.shape and x.dtype == (torch.float32 if name == "lse" else dtype), name
        assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


def _case_id(c):
    return f"{c[0]}x{c[1]}/{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{'causal' if c[6] else 'full'}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_error_within_twice_plain_attention(case, dtype):
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]))
    assert launch.unsupported_reason(q, k, v, causal, None) is None
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    plain = _plain(q, k, v, do, causal)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    _assert_within_budget(_sm90(q, k, v, do, causal), plain, gold, dtype)


REPEAT_CASES = [CASES[5], CASES[9], (1, 16, 4, 8192, 8192, 128, False), (2, 8, 8, 3000, 8191, 64, True)]


@pytest.mark.parametrize("case", REPEAT_CASES, ids=_case_id)
def test_repeat_runs_are_bitwise_identical(case):
    q, k, v, do = _inputs(case, torch.bfloat16, seed=3)
    first = _sm90(q, k, v, do, case[-1])
    for _ in range(2):
        _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
        again = _sm90(q, k, v, do, case[-1])
        for name, a, b in zip(NAMES, first, again, strict=True):
            assert torch.equal(a, b), f"{name} differs between identical runs"


def test_strided_inputs_match_contiguous():
    """The ``(B, S, H, d).transpose(1, 2)`` layout of attention layers, read in place by the descriptors;
    outputs keep their inputs' layouts."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    shape = (2, 333, 4, 128)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
                   for _ in range(4))  # fmt: skip
    ours = _sm90(q, k, v, do, True)
    dense = _sm90(*(t.contiguous() for t in (q, k, v, do)), True)
    for name, a, b in zip(NAMES, ours, dense, strict=True):
        assert torch.equal(a, b), f"{name}: strided and contiguous inputs disagree"
    assert ours[0].stride() == ours[2].stride() == q.stride() and ours[3].stride() == k.stride()


def test_lse_interchangeable_with_portable_kernels():
    """Same ``lse`` units and shape as the portable forward, and either backward runs from the other
    forward's ``o`` and ``lse``."""
    q, k, v, do = _inputs((1, 4, 4, 777, 1000, 128, True), torch.bfloat16, seed=11)
    portable, scale = KERNELS["portable"], _scale(q)
    o_s, lse_s = launch.forward(q, k, v, True, None, scale)
    o_p, lse_p = portable.forward(q, k, v, True, None, scale, None)
    assert lse_p.shape == lse_s.shape and lse_p.dtype == lse_s.dtype == torch.float32
    torch.testing.assert_close(lse_s, lse_p, atol=1e-3, rtol=0)
    from_portable = launch.backward(q, k, v, o_p, lse_p, do, True, None, scale)
    from_sm90 = portable.backward(q, k, v, o_s, lse_s, do, True, None, scale, None)
    reference_grads = portable.backward(q, k, v, o_p, lse_p, do, True, None, scale, None)
    for name, a, b, ref in zip(NAMES[2:], from_portable, from_sm90, reference_grads, strict=True):
        assert _rel_err(a, ref.double()) < 1e-2 and _rel_err(b, ref.double()) < 1e-2, name


def test_lse_is_natural_log_of_softmax_denominator():
    q, k, v, _ = _inputs((1, 2, 2, 65, 65, 64, False), torch.float16, seed=2)
    _, lse = launch.forward(q, k, v, False, None, _scale(q))
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(64)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=2e-3, rtol=0)


def _flash_attention(q, k, v, causal, window=None):
    return flash_attention(q, k, v, causal, window, return_lse=True)


def _triton(q, k, v, causal, window=None):
    o = FlashAttention2Triton.apply(q, k, v, causal, window)
    return o, o.grad_fn.saved_tensors[0]  # the one new tensor its forward saves: L


ENTRY_POINTS = {"flash_attention": _flash_attention, "FlashAttention2Triton": _triton}
PUBLIC_CASES = [CASES[1], CASES[4], CASES[5], CASES[6], CASES[9], CASES[11]]


def _public(fn, q, k, v, do, causal, window=None):
    """``o, lse, dq, dk, dv`` of a public entry point (``fn`` returns ``o, lse``)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = fn(*leaves, causal, window)
    o.backward(do)
    return [o.detach(), lse, *(t.grad for t in leaves)]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", PUBLIC_CASES, ids=_case_id)
def test_public_entry_points_run_the_sm90_kernels(case, dtype, entry):
    """On sm90 the public names run the sm90 kernels (bitwise the launchers' outputs), within twice plain
    attention's error against float64."""
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]) + 1)
    assert plan(q, k, v, causal, None) == Plan("sm90", "sm90")
    assert choose(q, k, v, causal)[:2] == ("sm90", "sm90")
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    plain = _plain(q, k, v, do, causal)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    ours = _public(ENTRY_POINTS[entry], q, k, v, do, causal)
    for name, a, b in zip(NAMES, ours, _sm90(q, k, v, do, causal), strict=True):
        assert torch.equal(a, b), f"{name}: the sm90 kernels did not run"
    _assert_within_budget(ours, plain, gold, dtype)


@pytest.mark.parametrize("case", [CASES[5], CASES[10]], ids=_case_id)
def test_public_entry_point_repeats_bitwise(case):
    q, k, v, do = _inputs(case, torch.bfloat16, seed=4)
    first = _public(_flash_attention, q, k, v, do, case[-1])
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    again = _public(_flash_attention, q, k, v, do, case[-1])
    for name, a, b in zip(NAMES, first, again, strict=True):
        assert torch.equal(a, b), f"{name} differs between identical runs"


def test_public_layouts_and_fallbacks():
    """The attention layer's ``(B, S, H, d).transpose(1, 2)`` layout and 3-D inputs take the sm90 kernels,
    and so do windows; fp32 and head dim 96 take the portable kernels."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    assert choose(q, k, v, True).forward == "sm90" == choose(q[0], k[0], v[0], True).forward
    assert torch.equal(flash_attention(q, k, v, True), launch.forward(q, k, v, True, None, _scale(q))[0])
    three_d = flash_attention(q[0], k[0], v[0], True)[None]
    assert torch.equal(three_d, flash_attention(q[:1], k[:1], v[:1], True))
    assert choose(q, k, v, True, window=(64, 0))[:2] == ("sm90", "sm90")
    assert choose(q.float(), k.float(), v.float(), True)[:2] == ("portable", "portable")
    assert choose(q[..., :96], k[..., :96], v[..., :96], True)[:2] == ("portable", "portable")


@pytest.mark.parametrize("kernels", [("sm90", "portable"), ("portable", "sm90")], ids="-".join)
@pytest.mark.parametrize("case", [CASES[3], CASES[10]], ids=_case_id)
def test_op_runs_the_kernel_sets_it_is_given(case, kernels):
    """``ops.Attention`` with one set's forward and the other's backward: bitwise the launchers' outputs
    (the backward reading the other forward's ``lse``), within twice plain attention's error."""
    causal = case[-1]
    q, k, v, do = _inputs(case, torch.bfloat16, seed=9)
    forward, backward = (KERNELS[name] for name in kernels)
    scale = _scale(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = ops.attention(*leaves, causal, None, scale, *kernels)
    o.backward(do)
    ours = [o.detach(), lse, *(t.grad for t in leaves)]
    o_direct, lse_direct = forward.forward(q, k, v, causal, None, scale, None)
    direct = [o_direct, lse_direct, *backward.backward(q, k, v, o_direct, lse_direct, do, causal, None, scale,
                                                       None)]  # fmt: skip
    for name, a, b in zip(NAMES, ours, direct, strict=True):
        assert torch.equal(a, b), f"{name}: not the {kernels} kernels' output"
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    _assert_within_budget(ours, _plain(q, k, v, do, causal), gold, torch.bfloat16)


WINDOW_CASES = [  # batch, heads_q, heads_kv, seq_q, seq_k, head_dim, causal, window (left, right)
    (1, 2, 2, 1, 1, 128, True, (0, 0)),
    (1, 4, 2, 97, 97, 64, True, (30, 0)),  # narrower than a tile
    (1, 4, 4, 1000, 1025, 128, False, (300, 200)),
    (2, 4, 1, 4097, 4097, 128, True, (1000, 0)),
    (1, 2, 2, 1025, 1025, 64, False, (0, 0)),  # the diagonal only: one key a query
    (1, 2, 2, 3000, 3000, 128, False, (5000, 5000)),  # wider than the sequence
    (1, 4, 4, 1100, 1000, 128, False, (50, 200)),  # more queries than keys, each still sees one
    (1, 32, 8, 2000, 2000, 128, True, (511, 0)),
]


def _window_id(c):
    return f"{_case_id(c[:7])}-w{c[7][0]}.{c[7][1]}"


def _oracle(q, k, v, do, causal, window):
    """``o, lse, dq, dk, dv`` of the independent oracle (explicit mask) in the inputs' dtype."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = attention(*leaves, causal, window)
    o.backward(do)
    group = q.shape[1] // k.shape[1]
    scores = q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = allowed(q.shape[2], k.shape[2], causal, window, q.device)
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1)
    return [o.detach(), lse.to(torch.float32 if q.dtype != torch.float64 else q.dtype),
            *(t.grad for t in leaves)]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=_window_id)
def test_sliding_window_kernels_and_public_path(case, dtype):
    """The sm90 kernels with a window, and the public path (the same kernels; with the portable backward
    given to the op, that backward reading the sm90 forward's ``lse``): every output within twice plain
    attention's error against float64, the public path's bitwise the kernels'."""
    *shape, causal, window = case
    q, k, v, do = _inputs((*shape, causal), dtype, seed=sum(shape) + window[0])
    assert plan(q, k, v, causal, window) == Plan("sm90", "sm90"), choose(q, k, v, causal, window).reason
    gold = _oracle(*(t.double() for t in (q, k, v, do)), causal, window)
    plain = _oracle(q, k, v, do, causal, window)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    kernels = _sm90(q, k, v, do, causal, window)
    public = _public(_flash_attention, q, k, v, do, causal, window)
    for name, a, b in zip(NAMES, kernels, public, strict=True):
        assert torch.equal(a, b), f"{name}: the public path did not run the sm90 kernels"

    def sm90_then_portable(q, k, v, causal, window):
        return ops.attention(q, k, v, causal, list(window), _scale(q), "sm90", "portable")

    mixed = _public(sm90_then_portable, q, k, v, do, causal, window)
    for ours in (kernels, mixed):
        _assert_within_budget(ours, plain, gold, dtype)


def test_sliding_window_kernels_repeat_bitwise_and_keyless_queries_are_refused():
    q, k, v, do = _inputs((1, 8, 2, 3000, 3000, 128, True), torch.bfloat16, seed=9)
    first = _sm90(q, k, v, do, True, (700, 0))
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    again = _sm90(q, k, v, do, True, (700, 0))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    short_k, short_v = k[:, :, :2000], v[:, :, :2000]
    assert "without keys" in launch.unsupported_reason(q, short_k, short_v, False, (10, 5))
    with pytest.raises(ValueError, match="would see no key"):
        flash_attention(q, short_k, short_v, False, (10, 5))


def test_sliding_window_keys_that_no_query_sees_get_zero_gradients():
    """Keys left of every query's band (more keys than queries): their dK/dV programs walk no query tile."""
    q, k, v, do = _inputs((1, 4, 4, 200, 1500, 64, True), torch.bfloat16, seed=12)
    o, _, dq, dk, dv = _sm90(q, k, v, do, True, (100, 0))
    gold = _oracle(*(t.double() for t in (q, k, v, do)), True, (100, 0))
    assert torch.equal(dk[:, :, :1100], torch.zeros_like(dk[:, :, :1100]))
    assert torch.equal(dv[:, :, :1100], torch.zeros_like(dv[:, :, :1100]))
    for name, x, g in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), (gold[0], *gold[2:]), strict=True):
        assert _rel_err(x, g) < 2e-2, name
