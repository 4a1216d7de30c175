"""GPU tests of the Hopper path (sm90), both backwards (seven and five tile products): error within twice
PyTorch's own low-precision attention against a float64 reference, poisoned outputs, bitwise-identical
repeats, GQA, strided inputs, and ``lse`` shared with the portable kernel. Errors: ||x - gold|| / ||gold||."""

import math

import pytest
import torch
from attention_oracle import allowed, attention
from flashattn import flash_attention, hopper, reference
from flashattn.dispatch import HOPPER_BACKWARD, HOPPER_FORWARD, choose, pinned_kernels
from flashattn.triton_flash import FlashAttention2Triton

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_HOPPER, reason="needs a compute-capability 9.0 GPU")]

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


def _plain(q, k, v, do, causal):
    """``o, lse, dq, dk, dv`` of plain attention in the inputs' dtype (K/V heads expanded for GQA)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    o, lse = reference(leaves[0], *(t.repeat_interleave(group, dim=1) for t in leaves[1:]), causal)
    o.backward(do)
    return [o.detach(), lse.detach(), *(t.grad for t in leaves)]


BACKWARDS = {
    "backward": hopper.backward,
    "backward5": hopper.backward5,
    "gluon_backward": hopper.gluon_backward,
    "gluon_backward5": hopper.gluon_backward5,
}


def _hopper(q, k, v, do, causal, backward="backward"):
    o, lse = hopper.forward(q, k, v, causal)
    return [o, lse, *BACKWARDS[backward](q, k, v, o, lse, do, causal)]


def _case_id(c):
    return f"{c[0]}x{c[1]}/{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{'causal' if c[6] else 'full'}"


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_error_within_twice_plain_attention(case, dtype, backward):
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]))
    assert hopper.unsupported_reason(q, k, v, causal) is None
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    plain = _plain(q, k, v, do, causal)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    ours = _hopper(q, k, v, do, causal, backward)
    for name, x, p, g in zip(("o", "lse", "dq", "dk", "dv"), ours, plain, gold, strict=True):
        assert x.shape == g.shape and x.dtype == (torch.float32 if name == "lse" else dtype), name
        assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


REPEAT_CASES = [CASES[5], CASES[9], (1, 16, 4, 8192, 8192, 128, False), (2, 8, 8, 3000, 8191, 64, True)]


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("case", REPEAT_CASES, ids=_case_id)
def test_repeat_runs_are_bitwise_identical(case, backward):
    """Also a race detector for the five-product backward: hundreds of key tiles add into each dQ tile."""
    q, k, v, do = _inputs(case, torch.bfloat16, seed=3)
    first = _hopper(q, k, v, do, case[-1], backward)
    for _ in range(2):
        _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
        again = _hopper(q, k, v, do, case[-1], backward)
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), first, again, strict=True):
            assert torch.equal(a, b), f"{name} differs between identical runs"


@pytest.mark.parametrize("five", [hopper.backward5, hopper.gluon_backward5], ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_five_product_backward_matches_seven_product(five, causal):
    """Same function on long inputs, where a wrong turn or a lost addition would stand out."""
    q, k, v, do = _inputs(REPEAT_CASES[2], torch.bfloat16, seed=8)
    o, lse = hopper.forward(q, k, v, causal)
    seven = hopper.backward(q, k, v, o, lse, do, causal)
    for name, a, b in zip(("dq", "dk", "dv"), five(q, k, v, o, lse, do, causal), seven, strict=True):
        assert _rel_err(a, b.double()) < 1e-2, name


@pytest.mark.parametrize("backward", BACKWARDS)
def test_strided_inputs_match_contiguous(backward):
    """The ``(B, S, H, d).transpose(1, 2)`` layout of attention layers, read in place by the descriptors."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    shape = (2, 333, 4, 128)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
                   for _ in range(4))  # fmt: skip
    ours = _hopper(q, k, v, do, True, backward)
    dense = _hopper(*(t.contiguous() for t in (q, k, v, do)), True, backward)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), ours, dense, strict=True):
        assert torch.equal(a, b), f"{name}: strided and contiguous inputs disagree"


def test_lse_interchangeable_with_portable_kernel():
    """Same ``lse`` units and shape as the portable kernel: its saved ``L`` drives the Hopper backward."""
    q, k, v, do = _inputs((1, 4, 4, 777, 1000, 128, True), torch.bfloat16, seed=11)
    _, lse_h = hopper.forward(q, k, v, True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o_p = FlashAttention2Triton.apply(*leaves, True)
    lse_p = o_p.grad_fn.saved_tensors[0]  # the one new tensor the portable forward saves
    o_p.backward(do)
    assert lse_p.shape == lse_h.shape and lse_p.dtype == lse_h.dtype
    torch.testing.assert_close(lse_h, lse_p, atol=1e-3, rtol=0)
    grads = hopper.backward(q, k, v, o_p.detach(), lse_p, do, True)
    for name, g, ref in zip(("dq", "dk", "dv"), grads, (t.grad for t in leaves), strict=True):
        assert _rel_err(g, ref.double()) < 1e-2, name


def test_lse_is_natural_log_of_softmax_denominator():
    q, k, v, _ = _inputs((1, 2, 2, 65, 65, 64, False), torch.float16, seed=2)
    _, lse = hopper.forward(q, k, v, False)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(64)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=2e-3, rtol=0)


ENTRY_POINTS = {"flash_attention": flash_attention, "FlashAttention2Triton": FlashAttention2Triton.apply}
SM90_FORWARD = {"hopper": hopper.forward, "gluon": hopper.gluon_forward}[HOPPER_FORWARD]
PUBLIC_CASES = [CASES[1], CASES[4], CASES[5], CASES[6], CASES[9], CASES[11]]


def _public(fn, q, k, v, do, causal, window=None):
    """``o, L, dq, dk, dv`` of a public entry point (``L``: the tensor it saves besides q, k, v, o)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves, causal, window)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do)
    return [o.detach(), lse, *(t.grad for t in leaves)]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", PUBLIC_CASES, ids=_case_id)
def test_public_entry_points_take_hopper_forward(case, dtype, entry):
    """On sm90 the public names run the chosen sm90 forward (bitwise its output) and backward, within twice
    plain attention's error against float64."""
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]) + 1)
    choice = choose(q, k, v, causal)
    expected = ("triton", HOPPER_FORWARD, HOPPER_BACKWARD[q.shape[-1]])
    assert (choice.name, choice.forward, choice.backward) == expected, choice
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    plain = _plain(q, k, v, do, causal)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    ours = _public(ENTRY_POINTS[entry], q, k, v, do, causal)
    assert torch.equal(ours[0], SM90_FORWARD(q, k, v, causal)[0]), "the sm90 forward did not run"
    for name, x, p, g in zip(("o", "lse", "dq", "dk", "dv"), ours, plain, gold, strict=True):
        assert x.shape == g.shape and x.dtype == (torch.float32 if name == "lse" else dtype), name
        assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


@pytest.mark.parametrize("case", [CASES[5], CASES[10]], ids=_case_id)
def test_public_entry_point_repeats_bitwise(case):
    q, k, v, do = _inputs(case, torch.bfloat16, seed=4)
    first = _public(flash_attention, q, k, v, do, case[-1])
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    again = _public(flash_attention, q, k, v, do, case[-1])
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), first, again, strict=True):
        assert torch.equal(a, b), f"{name} differs between identical runs"


def test_public_layouts_and_fallbacks():
    """The attention layer's ``(B, S, H, d).transpose(1, 2)`` layout and 3-D inputs take the sm90 forward;
    a window the Gluon kernels, fp32 the portable kernels."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    assert choose(q, k, v, True).forward == HOPPER_FORWARD == choose(q[0], k[0], v[0], True).forward
    torch.testing.assert_close(flash_attention(q, k, v, True), SM90_FORWARD(q, k, v, True)[0], atol=0, rtol=0)
    three_d = flash_attention(q[0], k[0], v[0], True)[None]
    assert torch.equal(three_d, flash_attention(q[:1], k[:1], v[:1], True))
    assert choose(q, k, v, True, window=(64, 0))[2:] == ("gluon", "gluon")
    assert choose(q.float(), k.float(), v.float(), True).forward == "portable"


# dispatch name -> BACKWARDS key
PINNED_BACKWARDS = {"hopper5": "backward5", "gluon": "gluon_backward", "gluon5": "gluon_backward5"}


@pytest.mark.parametrize("kernel", PINNED_BACKWARDS)
@pytest.mark.parametrize("case", [CASES[3], CASES[10]], ids=_case_id)
def test_public_path_runs_the_pinned_backward(case, kernel):
    """``FlashAttention2Triton`` with the five-product or the Gluon backward pinned: bitwise the launcher's
    own output."""
    q, k, v, do = _inputs(case, torch.bfloat16, seed=9)
    with pinned_kernels("gluon", kernel):
        ours = _public(FlashAttention2Triton.apply, q, k, v, do, case[-1])
    direct = BACKWARDS[PINNED_BACKWARDS[kernel]](q, k, v, ours[0], ours[1], do, case[-1])
    for name, a, b in zip(("dq", "dk", "dv"), ours[2:], direct, strict=True):
        assert torch.equal(a, b), name


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
def test_sliding_window_gluon_forward_and_public_path(case, dtype):
    """The Gluon kernels with a window, and the public path (the same kernels; with the portable backward
    pinned, that backward reading the Gluon forward's ``L``): every output within twice plain attention's
    error against float64, the public path's bitwise the kernels'."""
    *shape, causal, window = case
    q, k, v, do = _inputs((*shape, causal), dtype, seed=sum(shape) + window[0])
    choice = choose(q, k, v, causal, window)
    assert (choice.forward, choice.backward) == ("gluon", "gluon"), choice.reason
    gold = _oracle(*(t.double() for t in (q, k, v, do)), causal, window)
    plain = _oracle(q, k, v, do, causal, window)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    kernels = _windowed(q, k, v, do, causal, window)
    public = _public(flash_attention, q, k, v, do, causal, window)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), kernels, public, strict=True):
        assert torch.equal(a, b), f"{name}: the public path did not run the Gluon kernels"
    with pinned_kernels("gluon", "portable"):
        portable = _public(flash_attention, q, k, v, do, causal, window)
    for ours in (kernels, portable):
        for name, x, p, g in zip(("o", "lse", "dq", "dk", "dv"), ours, plain, gold, strict=True):
            assert x.shape == g.shape, name
            assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
            err, plain_err = _rel_err(x, g), _rel_err(p, g)
            assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


def _windowed(q, k, v, do, causal, window):
    o, lse = hopper.gluon_forward(q, k, v, causal, window)
    return [o, lse, *hopper.gluon_backward(q, k, v, o, lse, do, causal, window)]


def test_sliding_window_kernels_repeat_bitwise_and_refuse_keyless_queries():
    q, k, v, do = _inputs((1, 8, 2, 3000, 3000, 128, True), torch.bfloat16, seed=9)
    first = _windowed(q, k, v, do, True, (700, 0))
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    again = _windowed(q, k, v, do, True, (700, 0))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    with pytest.raises(ValueError, match="without keys"):
        hopper.gluon_forward(q, k[:, :, :2000], v[:, :, :2000], False, (10, 5))
    with pytest.raises(ValueError, match="without keys"):
        hopper.gluon_backward(q, k[:, :, :2000], v[:, :, :2000], *first[:2], do, False, (10, 5))


def test_sliding_window_keys_that_no_query_sees_get_zero_gradients():
    """Keys left of every query's band (more keys than queries): their dK/dV programs walk no query tile."""
    q, k, v, do = _inputs((1, 4, 4, 200, 1500, 64, True), torch.bfloat16, seed=12)
    o, _, dq, dk, dv = _windowed(q, k, v, do, True, (100, 0))
    gold = _oracle(*(t.double() for t in (q, k, v, do)), True, (100, 0))
    assert torch.equal(dk[:, :, :1100], torch.zeros_like(dk[:, :, :1100]))
    assert torch.equal(dv[:, :, :1100], torch.zeros_like(dv[:, :, :1100]))
    for name, x, g in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), (gold[0], *gold[2:]), strict=True):
        assert _rel_err(x, g) < 2e-2, name
