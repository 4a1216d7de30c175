"""The Triton kernels' newer features under TRITON_INTERPRET=1 on the CPU; prints their errors as JSON.

Executed in a subprocess by ``test_triton_features_interpret.py`` (the interpreter must be on before any
Triton kernel is defined). Grouped-query attention, head dims 24 ... 256, windows narrower and wider than the
pinned 16 x 32 tiles, packed documents with empty ones and rows without keys, ``+inf`` keys, bitwise repeats;
the ``split_`` cases pin separate dK and dV programs (as the tile table does above head dim 128), dV on 16-key
tiles stepping 32 queries, dK on 32-key tiles stepping 16.
"""

import json
import sys

import interpret_cases  # switches the interpreter on and patches it, before flashattn loads
import torch
from attention_oracle import attention, cu, packed, rel_err
from flashattn import flash_attention_varlen, reference
from flashattn.portable.tiles import TileConfig
from pinned_tiles import PortableVarlenWithTiles, PortableWithTiles

# (name, heads q/kv, seq_q, seq_k, head_dim, causal, window, dtype)
DENSE = [
    ("gqa_causal", (4, 2), 17, 17, 16, True, None, torch.float32),
    ("mqa_d80_window_narrow", (4, 1), 40, 40, 80, True, (5, 0), torch.float32),
    ("window_wide_q33_k45", (2, 2), 33, 45, 16, False, (40, 3), torch.float32),
    ("d256_causal", (2, 1), 20, 20, 256, True, None, torch.float32),
    ("fp16_d96_window", (2, 1), 37, 37, 96, False, (20, 20), torch.float16),
    ("window_beyond_int32", (2, 2), 17, 17, 16, False, (2**40, 2**40), torch.float32),
]
SPLIT = interpret_cases.PINNED._replace(dv=TileConfig(32, 16, 4, 1, "tf32x3"))
SPLIT_DENSE = [
    ("split_gqa_d192_window_narrow", (4, 2), 37, 37, 192, True, (5, 0), torch.float32),
    ("split_d256_window_wide_q33_k45", (2, 1), 33, 45, 256, False, (40, 3), torch.float32),
    ("split_d80_causal_q17", (2, 2), 17, 17, 80, True, None, torch.float32),
    ("split_fp16_d96_window", (2, 1), 37, 37, 96, False, (20, 20), torch.float16),
]
# (name, q lengths, k lengths, heads q/kv, head_dim, causal, window)
PACKED = [
    ("docs_0_1_33_20_causal", [0, 1, 33, 20], None, (4, 2), 24, True, None),
    ("docs_window", [0, 1, 33, 20], None, (2, 1), 16, False, (6, 2)),
    ("docs_without_keys", [3, 4, 2], [0, 2, 2], (2, 2), 16, True, None),
]
SPLIT_PACKED = [("split_docs_causal_window", [0, 1, 33, 20], None, (4, 2), 24, True, (6, 0))]


def _grads(fn, inputs, do):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(do)
    return [out.detach(), *(t.grad for t in leaves)]


def _errors(ours, gold, dtype) -> dict:
    names = ("o", "dq", "dk", "dv")
    return {"dtype": str(dtype)[6:], **{n: rel_err(a, b) for n, a, b in zip(names, ours, gold, strict=True)}}


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _dense(cases, results: dict, tiles) -> None:
    for name, (hq, hkv), seq_q, seq_k, d, causal, window, dtype in cases:
        sizes = [(hq, seq_q), (hkv, seq_k), (hkv, seq_k), (hq, seq_q)]
        q, k, v, do = (_randn(2, h, s, d, seed=i) for i, (h, s) in enumerate(sizes))
        gold = _grads(lambda *t, c=causal, w=window: attention(*t, c, w), (q, k, v), do)
        low = [t.to(dtype) for t in (q, k, v)]
        ours = _grads(
            lambda *t, c=causal, w=window: PortableWithTiles.apply(tiles, *t, c, w), low, do.to(dtype)
        )
        results[name] = _errors(ours, gold, dtype)


def _packed(cases, results: dict, attend) -> None:
    """``attend(q, k, v, cu_q, cu_k, max_q, max_k, causal, window)`` against the oracle, twice."""
    for name, lens_q, lens_k, (hq, hkv), d, causal, window in cases:
        lens_k = lens_k or lens_q
        q, do = (_randn(sum(lens_q), hq, d, seed=i) for i in (0, 1))
        k, v = (_randn(sum(lens_k), hkv, d, seed=i) for i in (2, 3))
        gold = _grads(
            lambda *t, a=lens_q, b=lens_k, c=causal, w=window: packed(*t, a, b, c, w), (q, k, v), do
        )
        args = (cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal, window)
        runs = [_grads(lambda *t, a=args: attend(*t, *a), [t.float() for t in (q, k, v)],
                       do.float()) for _ in range(2)]  # fmt: skip
        results[name] = _errors(runs[0], gold, torch.float32)
        results[name]["bitwise_repeat"] = float(all(torch.equal(a, b) for a, b in zip(*runs, strict=True)))


def main() -> None:
    torch.set_num_threads(1)
    results = {}
    pinned = interpret_cases.PINNED
    _dense(SPLIT_DENSE, results, SPLIT)
    _packed(SPLIT_PACKED, results, lambda *args: PortableVarlenWithTiles.apply(SPLIT, *args))
    _dense(DENSE, results, pinned)
    _packed(PACKED[:-1], results, lambda *args: PortableVarlenWithTiles.apply(pinned, *args))
    _packed(PACKED[-1:], results, flash_attention_varlen)  # the public op, the table's tiles
    q, k, v = (_randn(1, 2, 40, 16, seed=i).float() for i in range(3))
    k[0, 0, 3, 5] = float("inf")
    nan_rows = {}
    for causal in (False, True):
        want = reference(q, k, v, causal)[0].isnan().any(-1)
        got = PortableWithTiles.apply(pinned, q, k, v, causal, None).isnan().any(-1)
        nan_rows[f"causal={causal}"] = [int(want.sum()), int(got.sum()), int((want != got).sum())]
    results["inf_key_nan_rows"] = nan_rows
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
