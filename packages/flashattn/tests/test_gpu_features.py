"""GPU tests of grouped-query attention, head dims 80 ... 256, windows and packed documents (Triton kernels).

Error budget: against float64 math on the same inputs (the independent oracle), ours must be at most twice as
far as the oracle run in the input dtype (plain low-precision attention), plus a small floor. Memory is filled
with NaN first so unwritten outputs fail; repeats are bitwise equal.
"""

import pytest
import torch
from attention_oracle import attention, cu, packed
from flashattn import FlashAttention2Triton, flash_attention_varlen, reference
from flashattn.portable.tiles import TileConfig, configs_for, target_of
from harness.testing import assert_error_budget
from pinned_tiles import PortableWithTiles

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DENSE = [  # (batch, q heads, kv heads), seq_q, seq_k, head_dim, causal, window, dtype
    ((1, 4, 1), 1, 1, 80, True, None, torch.bfloat16),
    ((2, 4, 1), 17, 17, 96, False, None, torch.bfloat16),
    ((1, 4, 2), 97, 97, 192, True, (30, 0), torch.bfloat16),  # window narrower than a tile
    ((1, 8, 2), 1025, 1025, 256, True, None, torch.bfloat16),
    ((1, 4, 4), 1025, 1025, 128, False, (300, 200), torch.bfloat16),  # wider than a tile
    ((1, 4, 2), 1025, 1025, 256, True, None, torch.float32),
    ((1, 4, 1), 1025, 1025, 80, True, (100, 0), torch.float16),
]
LENGTHS = [0, 1, 33, 1000, 0]


def _poison() -> None:
    torch.full((1 << 27,), float("nan"), device="cuda")  # freed at once; the allocator hands it out next


def _grads(fn, inputs, do):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(do)
    return [out.detach(), *(t.grad for t in leaves)]


def _budget(ours, plain, gold, slack):
    for name, o, p, g in zip(("o", "dq", "dk", "dv"), ours, plain, gold, strict=True):
        assert_error_budget(o, p, g, floor=0.1, slack=slack, name=name)


def _randn(shape, dtype, seed):
    return torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize(
    "case", DENSE, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}-d{c[3]}-c{int(c[4])}-w{c[5]}-{c[6]}"
)
def test_dense_within_twice_plain(case):
    (batch, hq, hkv), seq_q, seq_k, d, causal, window, dtype = case
    sizes = [(hq, seq_q), (hkv, seq_k), (hkv, seq_k), (hq, seq_q)]
    q, k, v, do = (_randn((batch, h, s, d), dtype, seed=i) for i, (h, s) in enumerate(sizes))
    gold = _grads(lambda *t: attention(*t, causal, window), [t.double() for t in (q, k, v)], do.double())
    plain = _grads(lambda *t: attention(*t, causal, window), (q, k, v), do)
    _poison()
    ours = _grads(lambda *t: FlashAttention2Triton.apply(*t, causal, window), (q, k, v), do)
    _budget(ours, plain, gold, 1e-6 if dtype == torch.float32 else 1e-4)


@pytest.mark.parametrize("d, window", [(256, None), (192, (100, 0)), (128, (300, 20))])
def test_split_dkdv_programs_within_twice_plain(d, window):
    """dK and dV as separate programs (the tile table's option above head dim 128), chosen at any width."""
    q, do = (_randn((1, 4, 1025, d), torch.bfloat16, seed=i) for i in (0, 1))
    k, v = (_randn((1, 2, 1025, d), torch.bfloat16, seed=i) for i in (2, 3))
    gold = _grads(lambda *t: attention(*t, True, window), [t.double() for t in (q, k, v)], do.double())
    plain = _grads(lambda *t: attention(*t, True, window), (q, k, v), do)
    split = configs_for(d, torch.bfloat16, target_of(q.device))._replace(dv=TileConfig(64, 64, 8, 2))
    _poison()
    ours = _grads(lambda *t: PortableWithTiles.apply(split, *t, True, window), (q, k, v), do)
    _budget(ours, plain, gold, 1e-4)


@pytest.mark.parametrize(
    "causal, window, d", [(True, None, 128), (True, (64, 0), 128), (False, (20, 70), 128), (True, None, 192)]
)
def test_packed_documents_within_twice_plain(causal, window, d):
    """Packed documents (the portable kernels; at head dim 192 with dK and dV as separate programs)."""
    total = sum(LENGTHS)
    q, do = (_randn((total, 8, d), torch.bfloat16, seed=i) for i in (0, 1))
    k, v = (_randn((total, 2, d), torch.bfloat16, seed=i) for i in (2, 3))
    gold = _grads(lambda *t: packed(*t, LENGTHS, LENGTHS, causal, window), [t.double() for t in (q, k, v)],
                  do.double())  # fmt: skip
    plain = _grads(lambda *t: packed(*t, LENGTHS, LENGTHS, causal, window), (q, k, v), do)
    cu_seqlens = cu(LENGTHS).cuda()
    _poison()
    ours = _grads(lambda *t: flash_attention_varlen(*t, cu_seqlens, cu_seqlens, 1000, 1000, causal, window),
                  (q, k, v), do)  # fmt: skip
    _budget(ours, plain, gold, 1e-4)


def test_repeat_runs_are_bitwise_identical():
    q, do = (_randn((2, 8, 2000, 128), torch.bfloat16, seed=i) for i in (0, 1))
    k, v = (_randn((2, 2, 2000, 128), torch.bfloat16, seed=i) for i in (2, 3))
    cu_seqlens = cu([700, 0, 1300]).cuda()

    def both():
        dense = _grads(lambda *t: FlashAttention2Triton.apply(*t, True, (300, 0)), (q, k, v), do)
        flat = [t[0].transpose(0, 1) for t in (q, k, v, do)]
        docs = _grads(lambda *t: flash_attention_varlen(*t, cu_seqlens, cu_seqlens, 1300, 1300, True),
                      flat[:3], flat[3])  # fmt: skip
        return dense + docs

    first = both()
    _poison()
    assert all(torch.equal(a, b) for a, b in zip(first, both(), strict=True))


def test_inf_in_keys_gives_the_reference_nan_rows():
    q, k, v = (_randn((1, 2, 300, 64), torch.float32, seed=i) for i in range(3))
    k[0, 0, 100, 7] = float("inf")
    for causal in (False, True):
        want = reference(q, k, v, causal)[0].isnan().any(-1)
        got = FlashAttention2Triton.apply(q, k, v, causal, None).isnan().any(-1)
        assert want.any() and torch.equal(got, want)
