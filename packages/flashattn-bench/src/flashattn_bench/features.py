"""The ``features`` table of ``python -m flashattn_bench.bench``: each feature against its reference, bf16,
causal.

- gqa: 32 query / 8 K/V heads at (1, 8192, 128) against our MHA (32 / 32 heads; target: time <= 1.05 x
  MHA's) and against SDPA cuDNN and flash on K/V expanded beforehand (the expansion is not timed);
- d256: (1, 16, 8192, 256) against our (1, 32, 8192, 128), the same FLOPs, both on the portable kernels
  (target: TFLOP/s >= 0.85 x d128's), and against SDPA flash at d256;
- packed: 8 documents of 512 ... 8192 tokens (seed 0), 4 heads, against SDPA on the same padded to the
  longest with a boolean mask, in its fastest backend that takes one (target: >= 1.5x faster);
- window: window (4095, 0) at (1, 4, 32768, 128) on the portable kernels against full causal attention of
  the same kernels at that shape (target: >= 5x faster) and against their non-causal attention; and the
  public path's window (on sm90 the Gluon kernels, elsewhere the portable ones) against the portable one.

The d256 row's d128 reference and the window rows' references run the portable kernels by name
(:func:`flashattn_bench.util.kernel_sets`): on sm90 the public path would run the sm90 kernels for them, but
not for head dim 256, and the targets compare the same kernels.

``flop ratio`` is the reference's FLOPs over ours (visible pairs only; padded SDPA computes every pair): the
speed-up to expect at equal TFLOP/s. ``ratio`` is the measured one in the metric the target names.
"""

import math

import pandas as pd
import torch
from flashattn import flash_attention, flash_attention_varlen
from flashattn.precompile import Variant
from torch.nn.attention import SDPBackend

from flashattn_bench.util import kernel_sets, sdpa, time_passes

FEATURE_VARIANTS = [Variant(128, "bf16", True), Variant(256, "bf16", True),
                    Variant(128, "bf16", True, varlen=True), Variant(128, "bf16", True, window=(1, 0)),
                    Variant(128, "bf16", False)]  # fmt: skip
WINDOW = (4095, 0)  # each query sees itself and the 4095 keys before it


def document_lengths(count: int = 8, low: int = 512, high: int = 8192, seed: int = 0) -> list[int]:
    """``count`` lengths in ``[low, high]``: the first and last at the ends, the rest drawn with ``seed``."""
    drawn = torch.randint(low, high + 1, (count - 2,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [low, *drawn, high]


def _pairs_flops(heads: int, head_dim: int, pairs: float) -> float:
    from analysis.accounting import attention_flops

    return attention_flops(1, heads, 1, 1, head_dim) * pairs


def _causal_flops(heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    from analysis.accounting import attention_flops

    return attention_flops(1, heads, seq, seq, head_dim, causal=causal)


def _randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _time(fn, q, k, v, args, causal: bool = True) -> dict[str, float]:
    """ms of forward, backward, forward+backward of ``fn(q, k, v, causal)``, or NaN where it refuses or runs
    out."""
    try:
        return time_passes(fn, q, k, v, causal, args.warmup_ms, args.rep_ms)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        print(f"  refused: {type(exc).__name__}: {str(exc)[:90]}", flush=True)
        return dict.fromkeys(("fwd", "bwd", "fwd+bwd"), math.nan)
    finally:
        torch.cuda.empty_cache()


def _ours(window=None):
    return lambda q, k, v, causal: flash_attention(q, k, v, causal, window)


_portable = kernel_sets("portable", "portable")


def _measurements(args) -> dict[str, tuple[dict, float]]:
    """Every timed case: name -> (ms per pass, forward FLOPs)."""
    seq, out = 8192, {}
    q, kv = _randn(1, 32, seq, 128), [_randn(1, 8, seq, 128) for _ in range(2)]
    flops = _causal_flops(32, seq, 128)
    out["ours gqa 32/8"] = (_time(_ours(), q, *kv, args), flops)
    out["ours mha 32/32"] = (_time(_ours(), q, _randn(1, 32, seq, 128), _randn(1, 32, seq, 128), args), flops)
    wide = [t.repeat_interleave(4, dim=1) for t in kv]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        out[f"sdpa_{name} expanded 32/32"] = (_time(sdpa(backend), q, *wide, args), flops)
    del q, kv, wide
    big = [_randn(1, 16, seq, 256) for _ in range(3)]
    out["ours d256 16 heads"] = (_time(_ours(), *big, args), _causal_flops(16, seq, 256))
    out["sdpa_flash d256 16 heads"] = (
        _time(sdpa(SDPBackend.FLASH_ATTENTION), *big, args),
        out["ours d256 16 heads"][1],
    )
    del big
    q, k, v = (_randn(1, 32, seq, 128) for _ in range(3))
    out["ours d128 32 heads"] = (_time(_portable, q, k, v, args), flops)
    del q, k, v

    lengths = document_lengths()
    longest, total, heads = max(lengths), sum(lengths), 4
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    packed = [_randn(total, heads, 128) for _ in range(3)]
    docs_flops = sum(_causal_flops(heads, n, 128) for n in lengths)
    varlen = lambda q, k, v, causal: flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal)
    out["ours packed"] = (_time(varlen, *packed, args), docs_flops)
    del packed
    padded = [_randn(len(lengths), heads, longest, 128) for _ in range(3)]
    keys = torch.arange(longest, device="cuda")
    lens = torch.tensor(lengths, device="cuda")[:, None, None, None]
    mask = (keys[None, :] <= keys[:, None]) & (
        keys < lens
    )  # causal, padded keys hidden; padded rows see some
    best = None
    for name, backend in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        times = _time(sdpa(backend, attn_mask=mask), *padded, args, causal=False)  # the mask is causal
        out[f"sdpa_{name} padded+mask"] = (times, _causal_flops(heads, longest, 128, False) * len(lengths))
        if not math.isnan(times["fwd+bwd"]) and (best is None or times["fwd+bwd"] < out[best][0]["fwd+bwd"]):
            best = f"sdpa_{name} padded+mask"
    out["sdpa best padded+mask"] = (
        out[best] if best else (dict.fromkeys(("fwd", "bwd", "fwd+bwd"), math.nan), 1.0)
    )
    out["sdpa best padded+mask backend"] = (best or "none", 0.0)
    del padded, mask

    seq, heads = 32768, 4
    qkv = [_randn(1, heads, seq, 128) for _ in range(3)]
    pairs = WINDOW[0] * (WINDOW[0] + 1) / 2 + (seq - WINDOW[0]) * (WINDOW[0] + 1)
    window_flops = _pairs_flops(heads, 128, pairs)
    out["ours window 4096"] = (_time(_ours(WINDOW), *qkv, args), window_flops)
    windowed_portable = kernel_sets("portable", "portable", WINDOW)
    out["ours window 4096 portable"] = (_time(windowed_portable, *qkv, args), window_flops)
    out["ours causal 32768"] = (_time(_portable, *qkv, args), _causal_flops(heads, seq, 128))
    full = _causal_flops(heads, seq, 128, False)
    out["ours full 32768"] = (_time(_portable, *qkv, args, causal=False), full)
    return out


# (feature, ours, reference, metric, target): "time" is ours ms / reference ms (<= target),
# "speedup" reference ms / ours ms, "rate" ours TFLOP/s / reference TFLOP/s (both >= target).
COMPARISONS = [
    ("gqa", "ours gqa 32/8", "ours mha 32/32", "time", 1.05),
    ("gqa", "ours gqa 32/8", "sdpa_cudnn expanded 32/32", "speedup", None),
    ("gqa", "ours gqa 32/8", "sdpa_flash expanded 32/32", "speedup", None),
    ("d256", "ours d256 16 heads", "ours d128 32 heads", "rate", 0.85),
    ("d256", "ours d256 16 heads", "sdpa_flash d256 16 heads", "speedup", None),
    ("packed", "ours packed", "sdpa best padded+mask", "speedup", 1.5),
    ("window", "ours window 4096 portable", "ours causal 32768", "speedup", 5.0),
    ("window", "ours window 4096 portable", "ours full 32768", "speedup", None),
    ("window", "ours window 4096", "ours window 4096 portable", "speedup", None),
]


def feature_table(args) -> pd.DataFrame:
    """One row per (comparison, pass): both times, TFLOP/s, the FLOP ratio, the measured ratio, the target."""
    m = _measurements(args)
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
    rows = []
    for feature, ours, ref, metric, target in COMPARISONS:
        (ours_ms, ours_flops), (ref_ms, ref_flops) = m[ours], m[ref]
        label = f"{ref} ({m['sdpa best padded+mask backend'][0]})" if ref.startswith("sdpa best") else ref
        for p in ("fwd", "bwd", "fwd+bwd"):
            a, b = ours_ms[p], ref_ms[p]
            ratio = {"time": a / b, "speedup": b / a, "rate": (ours_flops / a) / (ref_flops / b)}[metric]
            met = ratio <= target if metric == "time" else ratio >= target if target else None
            rows.append({
                "feature": feature, "ours": ours, "reference": label, "pass": p,
                "ours ms": round(a, 3), "reference ms": round(b, 3),
                "ours TFLOP/s": round(ours_flops * factor[p] / a / 1e9, 1),
                "reference TFLOP/s": round(ref_flops * factor[p] / b / 1e9, 1),
                "flop ratio": round(ref_flops / ours_flops, 2), "metric": metric, "ratio": round(ratio, 3),
                "target": "" if target is None else f"{'<=' if metric == 'time' else '>='} {target}",
                "met": "" if target is None else ("yes" if met else "no"),
            })  # fmt: skip
    return pd.DataFrame(rows)
