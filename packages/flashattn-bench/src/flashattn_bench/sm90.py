"""Ablation of the Hopper attention path against SDPA (cuDNN, flash) and the portable Triton kernel.

Steps: the Triton-language kernels' tile tables (``tma-*``), the Gluon forward's variants (``gluon-*``,
:data:`flashattn.gluon_compile.VARIANTS`: the default, and one change each, such as without the pipelined
key loop, one or three consumer warpgroups, ping-pong, other stage counts), the five-product backward's
tiles (``bwd5-*``, :func:`flashattn.hopper.backward5`), the Gluon backward's (``gbwd-*``,
:func:`flashattn.hopper.gluon_backward`) and the five-product Gluon backward's (``g5-*``,
:func:`flashattn.hopper.gluon_backward5`).

One row per (technique step, pass, causal, length): median milliseconds (``triton.testing.do_bench``),
TFLOP/s (``4 B H Sq Sk d``, halved when causal, x2.5 for the backward; with ``--kernels``, also passes
``dq`` and ``dkdv``: each Gluon backward kernel alone, x1.5 and x2, for 3 and 4 tile products against the
forward's 2), and ratios to SDPA's cuDNN backend and to the portable kernel measured in the same run. Each
step pins one tile table through :func:`flashattn.hopper_tiles.pinned_configs`; ``err`` is the step's relative
error against cuDNN's output (forward) or gradients (backward), a guard against timing a wrong kernel.
Writes ``<out>.csv`` and ``<out>.md``.

    python -m flashattn.hopper_bench --seqs 8192 32768 --out docs/data/flashattn-hopper
"""

import argparse
from pathlib import Path

from flashattn.gluon_compile import VARIANTS as GLUON_VARIANTS

FWD_STEPS = {  # name -> forward tile (block_m, block_n, warps, stages, persistent, tile_major, warp_spec)
    "tma-128x64-s3": (128, 64, 8, 3),
    "tma-128x128-s2": (128, 128, 8, 2),
    "tma-128x128-s3": (128, 128, 8, 3),
    "tma-128x128-s3-tilemajor": (128, 128, 8, 3, False, True),
    "tma-128x128-s2-persistent": (128, 128, 8, 2, True, True),
    "tma-128x128-s3-warpspec": (128, 128, 8, 3, False, False, True),
}
BWD_STEPS = {  # name -> (dkdv tile, dq tile)
    "tma-dkdv64x128-s3-dq128x64-s3": ((64, 128, 8, 3), (128, 64, 8, 3)),
    "tma-dkdv64x128-s2-dq128x64-s2": ((64, 128, 8, 2), (128, 64, 8, 2)),
    "tma-dkdv64x128-s3-dq128x128-s2": ((64, 128, 8, 3), (128, 128, 8, 2)),
    "tma-dkdv32x128-s2-dq128x64-s2": ((32, 128, 8, 2), (128, 64, 8, 2)),
    "tma-dkdv64x128-s3-dq128x64-s3-warpspec": ((64, 128, 8, 3, False, False, True), (128, 64, 8, 3)),
}

BWD5_STEPS = {  # name -> dkdvdq tile (block_m queries, block_n keys, warps, stages)
    "bwd5-64x128-s3": (64, 128, 8, 3),
    "bwd5-64x128-s2": (64, 128, 8, 2),
    "bwd5-64x64-s3": (64, 64, 8, 3),
}

GLUON_BWD_STEPS = {  # name -> (dK/dV tile changes, dQ tile changes or None: the Triton-language dQ kernel)
    "default": ({}, {}),
    "dkdv-no-overlap": ({"overlap": False, "stages": 2}, {}),
    "triton-dq": ({}, None),
    "dq-no-overlap": ({}, {"overlap": False, "stages": 2}),
    "dq-keys-128": ({}, {"block_n": 128, "overlap": False, "stages": 2}),
    "gqa-head-major": ({"gqa_tile_major": False}, {}),
}

GLUON_BWD5_STEPS = {  # name -> changes to the five-product Gluon kernel's tile
    "default": {},
    "stage-at-once": {"defer_stage": False},
    "stages-2": {"stages": 2},
    "early-dq": {"early_dq": True},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flashattn.hopper_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32, help="query heads")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA); default: --heads")
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128), help="head dim")
    p.add_argument(
        "--seqs", type=int, nargs="+", default=[8192, 32768], help="sequence lengths (seq_q = seq_k)"
    )
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both", help="causal rows or not")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--fwd-steps", nargs="*", default=list(FWD_STEPS), help=f"of {list(FWD_STEPS)}")
    p.add_argument("--bwd-steps", nargs="*", default=list(BWD_STEPS), help=f"of {list(BWD_STEPS)}")
    p.add_argument("--bwd5-steps", nargs="*", default=list(BWD5_STEPS), help=f"of {list(BWD5_STEPS)}")
    p.add_argument(
        "--gluon-bwd-steps", nargs="*", default=list(GLUON_BWD_STEPS), help=f"of {list(GLUON_BWD_STEPS)}"
    )
    p.add_argument(
        "--gluon-bwd5-steps", nargs="*", default=list(GLUON_BWD5_STEPS), help=f"of {list(GLUON_BWD5_STEPS)}"
    )
    p.add_argument(
        "--gluon-steps", nargs="*", default=list(GLUON_VARIANTS), help=f"of {list(GLUON_VARIANTS)}"
    )
    p.add_argument("--kernels", action="store_true", help="also time each Gluon backward kernel alone")
    p.add_argument("--rep-ms", type=float, default=300.0, help="do_bench repetition time per measurement")
    p.add_argument("--out", default="hopper-bench", help="output path prefix (.csv and .md are added)")
    return p.parse_args(argv)


def _rel_err(x, ref) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


def _portable(q, k, v, causal):
    """The portable kernels for both passes (the public path runs the sm90 forward on this GPU)."""
    from flashattn.dispatch import pinned_kernels
    from flashattn.triton_flash import FlashAttention2Triton

    with pinned_kernels("portable", "portable"):
        return FlashAttention2Triton.apply(q, k, v, causal)


def _measure(args, seq: int, causal: bool, rows: list[dict]) -> None:
    """Append the rows of one (length, causal) shape: references first, then every step."""
    import torch
    from analysis.accounting import attention_flops
    from flashattn import hopper
    from flashattn.benchutil import sdpa
    from flashattn.hopper_tiles import HopperConfigs, HopperTile, configs_for, pinned_configs
    from harness.timing import do_bench
    from torch.nn.attention import SDPBackend

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    kv_heads = args.kv_heads or args.heads
    default = configs_for(args.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(seq)
    d = args.head_dim
    shape_q, shape_k = (args.batch, args.heads, seq, d), (args.batch, kv_heads, seq, d)
    q, do = (torch.randn(shape_q, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(shape_k, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    flops = attention_flops(args.batch, args.heads, seq, seq, args.head_dim, causal=causal)

    def record(step, pas, fn, err=float("nan")):
        ms = do_bench(fn, "cuda", warmup_ms=50, rep_ms=args.rep_ms)
        tflops = flops * {"bwd": 2.5, "dq": 1.5, "dkdv": 2.0}.get(pas, 1.0) / ms / 1e9
        rows.append({"seq": seq, "causal": causal, "pass": pas, "step": step, "ms": ms, "tflops": tflops,
                     "err_vs_cudnn": err})  # fmt: skip
        print(
            f"S={seq} causal={causal} {pas} {step}: {ms:.3f} ms {tflops:.0f} TFLOP/s err {err:.1e}",
            flush=True,
        )

    gqa = kv_heads < args.heads
    refs = {"sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, enable_gqa=gqa),
            "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION, enable_gqa=gqa)}  # fmt: skip
    if kv_heads == args.heads:
        refs["portable"] = _portable
    gold = {}
    for name, fn in refs.items():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.no_grad():
            record(name, "fwd", lambda fn=fn, leaves=leaves: fn(*leaves, causal))
        out = fn(*leaves, causal)
        out.backward(do, retain_graph=True)
        gold = gold or {"o": out.detach(), "grads": [t.grad.clone() for t in leaves]}
        record(name, "bwd", lambda out=out: out.backward(do, retain_graph=True))

    def grads_err(grads):
        return max(_rel_err(g, r) for g, r in zip(grads, gold["grads"], strict=True))

    steps = [("hopper-default", default)]
    steps += [
        (n, default._replace(forward=HopperTile(*t))) for n, t in FWD_STEPS.items() if n in args.fwd_steps
    ]
    for name, configs in steps:
        with pinned_configs(configs):
            o, lse = hopper.forward(q, k, v, causal)
            record(name, "fwd", lambda: hopper.forward(q, k, v, causal), _rel_err(o, gold["o"]))
    for name in args.gluon_steps:
        gluon = default._replace(gluon=default.gluon._replace(**GLUON_VARIANTS[name]))
        with pinned_configs(gluon):
            o_gluon, _ = hopper.gluon_forward(q, k, v, causal)
            record(
                f"gluon-{name}",
                "fwd",
                lambda: hopper.gluon_forward(q, k, v, causal),
                _rel_err(o_gluon, gold["o"]),
            )
    steps = [("hopper-default", default)]
    steps += [(n, HopperConfigs(default.forward, HopperTile(*kv), HopperTile(*dq)))
              for n, (kv, dq) in BWD_STEPS.items() if n in args.bwd_steps]  # fmt: skip
    for name, configs in steps:
        with pinned_configs(configs):
            err = grads_err(hopper.backward(q, k, v, o, lse, do, causal))
            record(name, "bwd", lambda: hopper.backward(q, k, v, o, lse, do, causal), err)
    for name in args.bwd5_steps:
        with pinned_configs(default._replace(dkdvdq=HopperTile(*BWD5_STEPS[name]))):
            err = grads_err(hopper.backward5(q, k, v, o, lse, do, causal))
            record(name, "bwd", lambda: hopper.backward5(q, k, v, o, lse, do, causal), err)
    for name in args.gluon_bwd_steps:
        dkdv, dq_tile = GLUON_BWD_STEPS[name]
        dq_tile = None if dq_tile is None else default.gluon_dq._replace(**dq_tile)
        with pinned_configs(
            default._replace(gluon_dkdv=default.gluon_dkdv._replace(**dkdv), gluon_dq=dq_tile)
        ):
            err = grads_err(hopper.gluon_backward(q, k, v, o, lse, do, causal))
            record(f"gbwd-{name}", "bwd", lambda: hopper.gluon_backward(q, k, v, o, lse, do, causal), err)
            if args.kernels:  # each kernel alone, in tile products: the dQ kernel 3, dK/dV 4 (forward: 2)
                dq, dk, dv, delta = (torch.empty_like(t) for t in (q, k, v, lse))
                passes = {
                    "dq": lambda a=(q, k, v, o, lse, do, causal, dq, delta): hopper.gluon_dq_pass(*a),
                    "dkdv": lambda a=(q, k, v, do, lse, delta, causal, dk, dv): hopper.gluon_dkdv_pass(*a),
                }
                for pas, fn in passes.items():
                    record(f"gbwd-{name}", pas, fn)
    for name in args.gluon_bwd5_steps:
        with pinned_configs(default._replace(gluon_dkdvdq=default.gluon_dkdvdq._replace(
                **GLUON_BWD5_STEPS[name]))):  # fmt: skip
            err = grads_err(hopper.gluon_backward5(q, k, v, o, lse, do, causal))
            record(f"g5-{name}", "bwd", lambda: hopper.gluon_backward5(q, k, v, o, lse, do, causal), err)


def _with_ratios(rows: list[dict], args):
    """The table with fwd+bwd sums of whole implementations, and ratios to cuDNN and the portable kernel."""
    import pandas as pd
    from analysis.accounting import attention_flops

    table = pd.DataFrame(rows)
    whole = table[~table.step.str.startswith(("tma-", "gluon-", "bwd5-", "gbwd-", "g5-"))]
    both = whole.groupby(["seq", "causal", "step"], sort=False).agg(
        ms=("ms", "sum"), err_vs_cudnn=("err_vs_cudnn", "max")
    )
    both = both.reset_index().assign(**{"pass": "fwd+bwd"})
    both["tflops"] = [3.5 * attention_flops(args.batch, args.heads, s, s, args.head_dim, causal=c) / ms / 1e9
                      for s, c, ms in zip(both.seq, both.causal, both.ms, strict=True)]  # fmt: skip
    table = pd.concat([table, both[table.columns]], ignore_index=True)
    key = ["seq", "causal", "pass"]
    for ref in ("sdpa-cudnn", "portable"):
        base = table[table.step == ref].set_index(key)["ms"].rename("base")
        table = table.join(base, on=key)
        table[f"vs_{ref}"] = table.pop("base") / table["ms"]
    return table.sort_values(key, kind="stable")


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from harness.results import to_markdown, write_table

    rows: list[dict] = []
    for seq in args.seqs:
        for causal in {"both": (True, False), "yes": (True,), "no": (False,)}[args.causal]:
            _measure(args, seq, causal, rows)
            torch.cuda.empty_cache()
    table = _with_ratios(rows, args)
    write_table(table, Path(args.out), ".3g")
    print(to_markdown(table, ".3g"))


if __name__ == "__main__":
    main()
