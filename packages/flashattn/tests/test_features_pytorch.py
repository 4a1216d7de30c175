"""The PyTorch version's grouped-query attention, head dims, windows and packed documents against the
independent float64 oracle; the dispatch; the helpers for document ids; errors naming the argument."""

import pytest
import torch
from attention_oracle import attention, cu, packed
from flashattn import (
    FlashAttention2PyTorch,
    cu_seqlens_from_doc_ids,
    flash_attention,
    flash_attention_varlen,
    positions_in_documents,
    reference,
)
from flashattn.dispatch import choose

TOL = {torch.float64: {"atol": 1e-10, "rtol": 1e-9}, torch.float32: {"atol": 2e-5, "rtol": 2e-4}}


def _grads(fn, inputs, do):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(do)
    return [out.detach(), *(t.grad for t in leaves)]


def _close(ours, gold, dtype):
    for name, a, b in zip(("o", "dq", "dk", "dv"), ours, gold, strict=True):
        torch.testing.assert_close(a.double(), b, **TOL[dtype], msg=lambda m, n=name: f"{n}: {m}")


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = [  # heads q/kv, seq_q, seq_k, head_dim, causal, window  (the PyTorch tile is 64 wide)
    ((4, 1), 1, 1, 16, True, None),
    ((4, 2), 17, 17, 80, True, None),
    ((6, 3), 97, 97, 96, False, (5, 2)),  # window narrower than a tile
    ((2, 2), 97, 130, 192, True, (100, 0)),  # wider than a tile
    ((4, 2), 40, 33, 256, False, (3, 30)),  # more queries than keys, window keeps every row seeing a key
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[0][0]}-{c[0][1]}-{c[1]}x{c[2]}-d{c[3]}-w{c[5]}")
def test_dense_features_match_oracle(case, dtype):
    (hq, hkv), seq_q, seq_k, d, causal, window = case
    sizes = [(hq, seq_q), (hkv, seq_k), (hkv, seq_k), (hq, seq_q)]
    q, k, v, do = (_randn(2, h, s, d, seed=i) for i, (h, s) in enumerate(sizes))
    gold = _grads(lambda *t: attention(*t, causal, window), (q, k, v), do)
    low = [t.to(dtype) for t in (q, k, v)]
    ours = _grads(lambda *t: FlashAttention2PyTorch.apply(*t, causal, window), low, do.to(dtype))
    _close(ours, gold, dtype)


@pytest.mark.parametrize("causal, window",
                         [(True, None), (False, (7, 3)), (True, (40, 0)), (False, (2**40, 5))])  # fmt: skip
def test_packed_documents_match_one_by_one(causal, window):
    lens = [0, 1, 33, 1000, 0, 5]
    q, k, v, do = (_randn(sum(lens), h, 24, seed=i) for i, h in enumerate((4, 2, 2, 4)))
    gold = _grads(lambda *t: packed(*t, lens, lens, causal, window), (q, k, v), do)
    ours = _grads(lambda *t: flash_attention_varlen(*t, cu(lens), cu(lens), 1000, 1000, causal, window),
                  (q, k, v), do)  # fmt: skip
    _close(ours, gold, torch.float64)


def test_packed_rows_without_keys_are_zero():
    lens_q, lens_k = [3, 4, 2], [0, 2, 2]  # no keys; causal with more queries than keys
    q, k, v = (_randn(sum(n), 2, 16, seed=i) for i, n in enumerate((lens_q, lens_k, lens_k)))
    o = flash_attention_varlen(q, k, v, cu(lens_q), cu(lens_k), 4, 2, is_causal=True)
    torch.testing.assert_close(o, packed(q, k, v, lens_q, lens_k, True), atol=1e-12, rtol=1e-12)
    assert (o[:5] == 0).all() and (o[5:] != 0).all()


def test_repeat_runs_are_bitwise_identical():
    q, k, v, do = (_randn(2, h, 70, 40, seed=i).float() for i, h in enumerate((4, 2, 2, 4)))
    runs = [
        _grads(lambda *t: FlashAttention2PyTorch.apply(*t, True, (9, 0)), (q, k, v), do) for _ in range(2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_inf_in_keys_gives_the_reference_nan_rows():
    q, k, v = (_randn(1, 2, 50, 16, seed=i) for i in range(3))
    k[0, 0, 3, 5] = float("inf")  # scores of key 3 are +inf or -inf by the sign of q[..., 5]
    for causal in (False, True):
        want = reference(q, k, v, causal)[0].isnan().any(-1)
        got = FlashAttention2PyTorch.apply(q, k, v, causal, None).isnan().any(-1)
        assert want.any() and torch.equal(got, want)


def test_doc_ids_to_cu_seqlens_and_positions():
    ids = torch.tensor([7, 7, 7, 2, 5, 5, 7])
    cu_seqlens, longest = cu_seqlens_from_doc_ids(ids)
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 4, 6, 7] and longest == 3
    assert positions_in_documents(cu_seqlens).tolist() == [0, 1, 2, 0, 0, 1, 0]
    assert cu_seqlens_from_doc_ids(torch.tensor([], dtype=torch.long))[0].tolist() == [0]
    with pytest.raises(ValueError, match="doc_ids must be a 1-D integer tensor"):
        cu_seqlens_from_doc_ids(torch.zeros(2, 3, dtype=torch.long))


def test_dispatch_names_the_path_and_why():
    q = torch.randn(1, 2, 8, 16)
    choice = choose(q, q, q)
    assert choice.forward == "pytorch" and "cpu" in choice.reason and "portable:" in choice.reason
    out = flash_attention(q, q, q, is_causal=True, window=(2, 0))
    torch.testing.assert_close(out.double(), attention(*(t.double() for t in (q, q, q)), True, (2, 0)),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q, k: FlashAttention2PyTorch.apply(q, q[:, :3], q[:, :3], False, None), "k and v have 3 h"),
        (lambda q, k: FlashAttention2PyTorch.apply(q[..., :12], k[..., :12], k[..., :12], False, None),
         r"multiples of 8 in \[16, 256\]"),
        (lambda q, k: FlashAttention2PyTorch.apply(q[..., :100], k[..., :100], k[..., :100], False, None),
         "head_dim 100"),
        (lambda q, k: flash_attention(q, k, k, False, (3, -1)), r"window must be None or \(left, right\)"),
        (lambda q, k: flash_attention(q, k, k, False, 4), "window must be"),
        (lambda q, k: flash_attention(q, k[:, :, :5], k[:, :, :5], False, (0, 1)), "first queries"),
    ],
)  # fmt: skip
def test_unsupported_inputs_name_the_argument(call, match):
    q, k = torch.randn(1, 4, 8, 128), torch.randn(1, 2, 8, 128)
    with pytest.raises(ValueError, match=match):
        call(q, k)


@pytest.mark.parametrize(
    "cu_q, max_q, match",
    [
        (torch.tensor([0, 4, 9]), 5, "int32"),
        (cu([4, 6]), 6, r"rise from 0 to 9"),
        (torch.tensor([0, 6, 4, 9], dtype=torch.int32), 6, "rise from 0"),
        (cu([4, 5]), 4, "max_seqlen for cu_seqlens_q must be >= the longest document 5"),
    ],
)
def test_bad_cu_seqlens_are_refused(cu_q, max_q, match):
    q = torch.randn(9, 2, 16)
    with pytest.raises(ValueError, match=match):
        flash_attention_varlen(q, q, q, cu_q, cu([4, 5]), max_q, 5)


def test_cu_seqlens_on_the_host_are_read_every_call():
    """CPU lengths are read on each call, so a tensor changed in place (through a view of any kind) is
    checked again rather than trusted."""
    from flashattn.varlen import check_cu_seqlens

    cu_q = cu([4, 5])
    check_cu_seqlens(cu_q, "cu_seqlens_q", 9, 5, cu_q.device)
    cu_q.numpy()[2] = 12  # changed behind torch's version counter
    with pytest.raises(ValueError, match="must rise from 0 to 9"):
        check_cu_seqlens(cu_q, "cu_seqlens_q", 9, 5, cu_q.device)


def test_strided_cu_seqlens_reach_the_kernels_contiguous():
    """The kernels index cu_seqlens as contiguous: a strided view with the right values is copied."""
    from flashattn.varlen import check_cu_seqlens

    strided = torch.tensor([0, 99, 4, 99, 9, 99], dtype=torch.int32)[::2]
    checked = check_cu_seqlens(strided, "cu_seqlens_q", 9, 5, strided.device)
    assert checked.is_contiguous() and torch.equal(checked, cu([4, 5]))


@pytest.mark.parametrize("values", [[0, 4, 12], [0, 7, 3, 9], [-2, 4, 9], [0, 2, 9]])
def test_device_check_clamps_and_asserts(values):
    """The check used for CUDA tensors (no host read): a bad tensor is reported by a device-side
    assertion (raised at once on the CPU) and clamped into [0, total], non-decreasing, in any case."""
    from flashattn.varlen import _checked_on_device

    cu_q = torch.tensor(values, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must rise from 0 to the packed length"):
        _checked_on_device(cu_q, "cu_seqlens_q", 9, 5)
    clamped = torch.cummax(cu_q.clamp(0, 9), 0).values
    assert clamped.min() >= 0 and clamped.max() <= 9 and bool((clamped.diff() >= 0).all())
    assert torch.equal(_checked_on_device(cu([4, 5]), "cu_seqlens_q", 9, 5), cu([4, 5]))


def test_helpers_check_their_inputs_as_the_calls_do():
    from flashattn.dispatch import choose
    from flashattn.varlen import packed_attention, positions_in_documents

    with pytest.raises(ValueError, match="cu_seqlens must be an int32 tensor"):
        positions_in_documents(torch.tensor([0.0, 3.0, 5.0]))
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0 to 3"):
        positions_in_documents(torch.tensor([0, 5, 3], dtype=torch.int32))
    flat = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match=r"q must be \(batch, heads, seq, head_dim\) for packed_attention"):
        packed_attention(cu([3, 2]), 3)(flat, flat, flat, True)
    whole = torch.ones(1, 2, 4, 16, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"q has dtype torch\.int64"):
        choose(whole, whole, whole)
