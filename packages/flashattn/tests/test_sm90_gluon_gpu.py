"""GPU tests of the warp-specialised Gluon forward (:func:`flashattn.hopper.gluon_forward`, sm90): ``o`` and
``lse`` within twice PyTorch's own low-precision attention's error against float64, poisoned outputs,
bitwise-identical repeats, and the public path with it pinned (its ``L`` driving the portable backward).
The tile table's kernel and each ablation variant of :data:`flashattn.gluon_compile.VARIANTS` are tested."""

import contextlib

import pytest
import torch
from flashattn import hopper, hopper_tiles
from flashattn.dispatch import pinned_kernels
from flashattn.gluon_compile import VARIANTS
from flashattn.triton_flash import FlashAttention2Triton
from test_hopper_gpu import CASES, DTYPES, ON_HOPPER, _case_id, _inputs, _plain, _poison_allocator, _rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_HOPPER, reason="needs a compute-capability 9.0 GPU")]


def _variant(name: str, head_dim: int):
    """The Gluon tile of ``head_dim`` changed as variant ``name`` says, pinned for the ``with`` block."""
    if name == "default":
        return contextlib.nullcontext()
    table = hopper_tiles.configs_for(head_dim)
    return hopper_tiles.pinned_configs(table._replace(gluon=table.gluon._replace(**VARIANTS[name])))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_error_within_twice_plain_attention(case, dtype, variant):
    causal = case[-1]
    q, k, v, do = _inputs(case, dtype, seed=sum(case[:6]) + 2)
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)[:2]
    plain = _plain(q, k, v, do, causal)[:2]
    _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
    with _variant(variant, case[5]):
        ours = hopper.gluon_forward(q, k, v, causal)
    for name, x, p, g in zip(("o", "lse"), ours, plain, gold, strict=True):
        assert x.shape == g.shape and x.dtype == (torch.float32 if name == "lse" else dtype), name
        assert torch.isfinite(x).all(), f"{name} has unwritten (NaN) or infinite elements"
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"


@pytest.mark.parametrize("variant", ["default", "pingpong", "persistent"])
def test_repeats_bitwise_and_reads_strided_inputs(variant):
    q, k, v, _ = _inputs(CASES[9], torch.bfloat16, seed=8)
    with _variant(variant, 128):
        first = hopper.gluon_forward(q, k, v, True)
        _poison_allocator(8 * (q.numel() + k.numel()) * q.element_size())
        again = hopper.gluon_forward(q, k, v, True)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(2, 333, 4, 128, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    strided = hopper.gluon_forward(q, k, v, False)
    dense = hopper.gluon_forward(q.contiguous(), k.contiguous(), v.contiguous(), False)
    assert all(torch.equal(a, b) for a, b in zip(strided, dense, strict=True))


@pytest.mark.parametrize("case", [CASES[3], CASES[10]], ids=_case_id)
def test_public_path_with_gluon_forward(case):
    causal = case[-1]
    q, k, v, do = _inputs(case, torch.bfloat16, seed=12)
    gold = _plain(*(t.double() for t in (q, k, v, do)), causal)
    plain = _plain(q, k, v, do, causal)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with pinned_kernels("gluon", "portable"):
        o = FlashAttention2Triton.apply(*leaves, causal)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do)
    ours = [o.detach(), lse, *(t.grad for t in leaves)]
    assert torch.equal(ours[0], hopper.gluon_forward(q, k, v, causal)[0]), "the Gluon forward did not run"
    for name, x, p, g in zip(("o", "lse", "dq", "dk", "dv"), ours, plain, gold, strict=True):
        err, plain_err = _rel_err(x, g), _rel_err(p, g)
        assert err <= 2 * plain_err + 1e-4, f"{name}: error {err:.2e} vs plain {plain_err:.2e}"
