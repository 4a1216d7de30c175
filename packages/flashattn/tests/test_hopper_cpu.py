"""CPU tests of the Hopper path: which calls it covers (:func:`flashattn.hopper.unsupported_reason`),
its input errors, and its kernels (both backwards) run by Triton's interpreter (fp16, small tiles) against
float64 attention.

Run as a script (``TRITON_INTERPRET=1 python test_hopper_cpu.py``) it prints the interpreted kernels' errors
as JSON; the test below starts it so, because the interpreter must be on before the kernels are defined."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness.testing import relative_error

INTERPRETED = [  # batch, heads_q, heads_kv, seq_q, seq_k, causal, persistent + tile-major forward
    (1, 2, 2, 37, 37, True, False),
    (2, 4, 2, 21, 50, True, True),
    (1, 4, 1, 33, 19, False, True),
    (1, 1, 1, 1, 5, True, False),
    (1, 2, 1, 70, 100, False, False),  # four key tiles add into every dQ tile
]


def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


def test_unsupported_reason_names_the_cause():
    from flashattn import hopper

    q, kv = _t(1, 8, 64, 128), _t(1, 2, 64, 128)
    assert "CUDA" in hopper.unsupported_reason(q, kv, kv, True)  # CPU tensors: the shapes themselves are fine
    cases = {
        "float32": (_t(1, 8, 64, 128, dtype=torch.float32), _t(1, 8, 64, 128, dtype=torch.float32), False),
        "head dims": (_t(1, 8, 64, 96), _t(1, 8, 64, 96), False),
        "heads dividing": (q, _t(1, 3, 64, 128), False),
        "seq_q <= seq_k": (_t(1, 8, 65, 128), _t(1, 8, 64, 128), True),
        "(batch, heads, seq, head_dim)": (_t(8, 64, 128), _t(8, 64, 128), False),
        "not a bool": (q, kv, 1),
    }
    for expected, (qq, kk, causal) in cases.items():
        reason = hopper.unsupported_reason(qq, kk, kk, causal)
        assert reason is not None and expected in reason, (expected, reason)


def test_kernels_refuse_bad_input_by_name():
    from flashattn import hopper

    with pytest.raises(ValueError, match="head dims"):
        hopper.forward(_t(1, 2, 9, 80), _t(1, 2, 9, 80), _t(1, 2, 9, 80), False)
    with pytest.raises(ValueError, match="lse must be fp32"):
        q = _t(1, 2, 9, 64)
        hopper.backward(q, q, q, q, _t(1, 2, 9), q, False)


@pytest.mark.parametrize("name", ["gluon_backward", "gluon_backward5"])
def test_gluon_backwards_refuse_bad_input_and_other_devices_by_name(name):
    """Checked before any allocation or launch: the input's fault first, then the device's."""
    from flashattn import hopper

    backward = getattr(hopper, name)
    q = _t(1, 2, 9, 64)
    with pytest.raises(ValueError, match="lse must be fp32"):
        backward(q, q, q, q, _t(1, 2, 9), q, False)
    with pytest.raises(ValueError, match="q is on cpu; the Hopper kernels need CUDA tensors"):
        backward(q, q, q, q, _t(1, 2, 9, dtype=torch.float32), q, False)


def test_interpreted_kernels_match_float64():
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    errors = json.loads(done.stdout)
    assert len(errors) == len(INTERPRETED) + 1
    assert errors["public"].pop("o equals hopper.forward's") == 1.0
    bad = [
        f"{case} {name} {e:.2e}" for case, errs in errors.items() for name, e in errs.items() if not e < 3e-3
    ]
    assert not bad, bad


def _float64_attention(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        seq_q, seq_k = q.shape[2], k.shape[2]
        visible = torch.arange(seq_k)[None, :] <= torch.arange(seq_q)[:, None] + seq_k - seq_q
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def _interpreted_errors() -> dict[str, dict[str, float]]:
    from flashattn import hopper
    from flashattn.hopper_tiles import HopperConfigs, HopperTile
    from flashattn.hopper_tiles import pinned_configs as pinned_tiles

    def err(x, gold):
        return relative_error(x, gold, floor=1e-2)

    gen = torch.Generator().manual_seed(0)
    out = {}
    for batch, heads, heads_kv, seq_q, seq_k, causal, persistent in INTERPRETED:
        q, do = (torch.randn(batch, heads, seq_q, 64, generator=gen).half() for _ in range(2))
        k, v = (torch.randn(batch, heads_kv, seq_k, 64, generator=gen).half() for _ in range(2))
        tiles = HopperConfigs(HopperTile(16, 16, 4, 1, persistent, persistent), HopperTile(16, 32, 4, 1),
                              HopperTile(32, 16, 4, 1, tile_major=persistent),
                              dkdvdq=HopperTile(16, 32, 4, 1))  # fmt: skip
        with pinned_tiles(tiles):
            o, lse = hopper.forward(q, k, v, causal)
            grads = hopper.backward(q, k, v, o, lse, do, causal)
            grads5 = hopper.backward5(q, k, v, o, lse, do, causal)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        gold_o, gold_lse = _float64_attention(*leaves, causal)
        gold_o.backward(do.double())
        errs = {"o": err(o, gold_o), "lse": err(lse, gold_lse)}
        errs |= {n: err(g, t.grad) for n, g, t in zip(("dq", "dk", "dv"), grads, leaves, strict=True)}
        errs |= {f"{n} (5 products)": err(g, t.grad) for n, g, t in zip(("dq", "dk", "dv"), grads5, leaves,
                                                                        strict=True)}  # fmt: skip
        out[f"{batch}x{heads}/{heads_kv}-{seq_q}x{seq_k}-{'causal' if causal else 'full'}"] = errs
    return out | {"public": _public_errors(tiles, gen)}


def _public_errors(tiles, gen) -> dict[str, float]:
    """``FlashAttention2Triton`` on a pretended sm90 with the Triton-language Hopper forward pinned (the Gluon
    one does not run interpreted): bitwise ``hopper.forward``'s output, then the portable backward from the
    saved O and L."""
    from flashattn import hopper
    from flashattn.dispatch import pinned_kernels
    from flashattn.hopper_tiles import pinned_configs as pinned_tiles
    from flashattn.triton_flash import FlashAttention2Triton, KernelConfigs, TileConfig, pinned_configs

    hopper.device_reason = lambda device: None
    portable = KernelConfigs(TileConfig(16, 32, 4, 1), TileConfig(16, 32, 4, 1), TileConfig(32, 16, 4, 1))
    q, do = (torch.randn(2, 4, 29, 64, generator=gen).half() for _ in range(2))
    k, v = (torch.randn(2, 2, 45, 64, generator=gen).half() for _ in range(2))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with pinned_tiles(tiles), pinned_configs(portable):
        with pinned_kernels("hopper", "portable"):
            o = FlashAttention2Triton.apply(*leaves, True)
        o.backward(do)
        same = torch.equal(o.detach(), hopper.forward(q, k, v, True)[0])
    gold = [t.double().requires_grad_() for t in (q, k, v)]
    gold_o, _ = _float64_attention(*gold, True)
    gold_o.backward(do.double())
    errs = {"o": relative_error(o.detach(), gold_o, floor=1e-2)}
    for name, t, g in zip(("dq", "dk", "dv"), leaves, gold, strict=True):
        errs[name] = relative_error(t.grad, g.grad, floor=1e-2)
    return errs | {"o equals hopper.forward's": float(same)}


if __name__ == "__main__":
    print(json.dumps(_interpreted_errors()))
