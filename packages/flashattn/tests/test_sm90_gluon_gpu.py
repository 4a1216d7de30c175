"""GPU tests of the sm90 kernels' launch shapes (:mod:`flashattn.sm90.tiles`): the table's forward tile and
each of its variants (the other number of K/V slots, the other of persistent / one item a program), and the
backward's dQ pipelining and dK/dV program order. ``o`` and ``lse`` within twice PyTorch's own
low-precision attention's error against float64, poisoned outputs, bitwise-identical repeats and strided
inputs. Each variant compiles for sm_90a within a Hopper block's shared memory (99-230 KB)."""

import pytest
import torch
from flashattn.sm90 import launch
from flashattn.sm90.tiles import TILES, ForwardTile
from test_sm90_gpu import (
    CASES,
    DTYPES,
    NAMES,
    ON_SM90,
    _assert_within_budget,
    _case_id,
    _inputs,
    _plain,
    _poison_allocator,
    _rel_err,
    _scale,
    _sm90,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_SM90, reason="needs a compute-capability 9.0 GPU")]

VARIANTS = ("table", "other-stages", "other-persistence")


def _forward_tile(variant: str, head_dim: int) -> ForwardTile:
    """The table's forward tile for ``head_dim``, or that tile with two K/V slots instead of three (or three
    instead of two), or with the other launch (persistent instead of one item a program, or back)."""
    tile = TILES[head_dim].forward
    if variant == "other-stages":
        return tile._replace(stages=5 - tile.stages)
    if variant == "other-persistence":
        return tile._replace(persistent=not tile.persistent)
    return tile


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_error_within_twice_plain_attention(case, dtype, variant):
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]) + 2)
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)[:2]
    plain = _plain(q, k, v, do, causal)[:2]
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    ours = launch.forward(q, k, v, causal, None, _scale(q), _forward_tile(variant, case[5]))
    for name, x, p, g in zip(("o", "lse"), ours, plain, gold, strict=True):
        assert x.shape == g.shape and x.dtype == (torch.float32 if name == "lse" else dtype), name
        assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


@pytest.mark.parametrize("variant", ["table", "other-persistence"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_forward_repeats_bitwise_and_reads_strided_inputs(head_dim, variant):
    tile = _forward_tile(variant, head_dim)
    q, k, v, _ = _inputs((1, 32, 8, 1000, 1000, head_dim, True), torch.bfloat16, seed=8)
    first = launch.forward(q, k, v, True, None, _scale(q), tile)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    again = launch.forward(q, k, v, True, None, _scale(q), tile)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(2, 333, 4, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               .transpose(1, 2) for _ in range(3))  # fmt: skip
    strided = launch.forward(q, k, v, False, None, _scale(q), tile)
    dense = launch.forward(q.contiguous(), k.contiguous(), v.contiguous(), False, None, _scale(q), tile)
    assert all(torch.equal(a, b) for a, b in zip(strided, dense, strict=True))


BACKWARD_CASES = [CASES[3], CASES[10], CASES[12], (1, 4, 2, 1000, 1025, 64, False)]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_case_id)
def test_backward_tile_variants(case):
    """dQ with its pipelining switched (``overlap``) within twice plain attention's error; dK/dV with the
    programs in head order instead of longest-first over every head (``gqa_tile_major``) bitwise the
    table's (each program sums its keys' gradients in the same order either way)."""
    causal, head_dim = case[-1], case[5]
    q, k, v, do = _inputs(case, torch.bfloat16, seed=sum(case[:6]) + 3)
    tiles = TILES[head_dim]
    table = _sm90(q, k, v, do, causal)
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    other = _sm90(q, k, v, do, causal, dq_tile=tiles.dq._replace(overlap=not tiles.dq.overlap),
                  dkdv_tile=tiles.dkdv._replace(gqa_tile_major=not tiles.dkdv.gqa_tile_major))  # fmt: skip
    for name, a, b in zip(NAMES, table, other, strict=True):
        if name != "dq":
            assert torch.equal(a, b), f"{name} changed with the dK/dV program order"
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    _assert_within_budget(other, _plain(q, k, v, do, causal), gold, torch.bfloat16)
