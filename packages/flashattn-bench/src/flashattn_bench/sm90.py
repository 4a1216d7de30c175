"""Ablation of the sm90 Gluon kernels against SDPA (cuDNN, flash) and the portable Triton kernels.

Steps: the Gluon forward's variants (``gluon-*``, :data:`flashattn_bench.compile_report.VARIANTS`: the tile
table's entry, and one change each to its :class:`flashattn.sm90.tiles.ForwardTile`, such as other stage
counts or a persistent grid) and the Gluon backward's (``gbwd-*``, :data:`BACKWARD_STEPS`: changes to its
:class:`~flashattn.sm90.tiles.DqTile` and :class:`~flashattn.sm90.tiles.DkdvTile`). References, whole
implementations through ``flashattn.ops.attention``: ``sm90`` (both passes on the sm90 kernels, what the
public path runs here) and ``portable``; and SDPA's ``sdpa-cudnn`` and ``sdpa-flash``.

One row per (technique step, pass, causal, length): median milliseconds (``triton.testing.do_bench``),
TFLOP/s (``4 B H Sq Sk d``, halved when causal, x2.5 for the backward; with ``--kernels``, also passes
``dq`` and ``dkdv``: each Gluon backward kernel's mean time inside the step's backward, read from the
profiler, x1.5 and x2, for 3 and 4 tile products against the forward's 2), and ratios to SDPA's cuDNN backend
and to the portable kernels measured in the same run. Each step passes its tiles to
:func:`flashattn.sm90.launch.forward` / :func:`~flashattn.sm90.launch.backward`; ``err`` is the step's
relative error against cuDNN's output (forward) or gradients (backward), a guard against timing a wrong
kernel. A step whose tile does not fit is reported and left out. Writes ``<out>.csv`` and ``<out>.md``.

    python -m flashattn_bench.sm90 --seqs 8192 32768 --out docs/data/flashattn-sm90
"""

import argparse
import math
from pathlib import Path

from harness import cli

from flashattn_bench.compile_report import VARIANTS

BACKWARD_STEPS = {  # name -> (changes to the table's DqTile, changes to its DkdvTile)
    "default": ({}, {}),
    "dq-no-overlap": ({"overlap": False, "stages": 2}, {}),
    "dq-keys-128": ({"block_n": 128, "overlap": False, "stages": 2}, {}),
    "dq-keys-64-overlap": ({"block_n": 64, "overlap": True, "stages": 3}, {}),
    "dkdv-stages-2": ({}, {"stages": 2}),
    "gqa-head-major": ({}, {"gqa_tile_major": False}),
}
REFERENCES = ("sdpa-cudnn", "sdpa-flash", "portable", "sm90")
KERNEL_NAMES = {"dq": "gluon_dq_kernel", "dkdv": "gluon_dkdv_kernel"}
FLOP_FACTOR = {"bwd": 2.5, "dq": 1.5, "dkdv": 2.0}  # tile products against the forward's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.command_parser("python -m flashattn_bench.sm90", __doc__)
    p.add_argument("--batch", type=cli.positive_int, default=1, help="batch size")
    p.add_argument("--heads", type=cli.positive_int, default=32, help="query heads")
    p.add_argument(
        "--kv-heads", type=cli.positive_int, default=None, help="K/V heads (GQA); default: --heads"
    )
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128), help="head dim")
    cli.add_list(p, "--seqs", cli.positive_int, [8192, 32768], "sequence lengths (seq_q = seq_k)")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both", help="causal rows or not")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="input dtype")
    p.add_argument("--gluon-steps", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                   help="forward variants (changes to the table's ForwardTile)")  # fmt: skip
    p.add_argument("--gluon-bwd-steps", nargs="*", default=list(BACKWARD_STEPS), choices=list(BACKWARD_STEPS),
                   help="backward steps (changes to the table's DqTile and DkdvTile)")  # fmt: skip
    p.add_argument("--kernels", action="store_true", help="also time each Gluon backward kernel alone")
    p.add_argument("--rep-ms", type=cli.positive_float, default=300.0,
                   help="do_bench repetition time per measurement (ms)")  # fmt: skip
    cli.add_out(p, "sm90-bench", "output path prefix (.csv and .md are added)")
    return p.parse_args(argv)


def _rel_err(x, ref) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


def _kernel_sets(name: str):
    """``(q, k, v, causal) -> o`` through ``flashattn.ops.attention`` with kernel set ``name`` for both
    passes."""
    from flashattn import ops

    def attend(q, k, v, causal):
        return ops.attention(q, k, v, causal, None, q.shape[-1] ** -0.5, name, name)[0]

    return attend


def kernel_ms(fn, names: dict[str, str], calls: int = 20) -> dict[str, float]:
    """Mean device milliseconds per call of ``fn`` spent in each kernel (pass -> kernel name as launched),
    read from the profiler over ``calls`` calls after a warm one."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    return {p: sum(e.device_time_total for e in events if kernel in e.key) / calls / 1e3
            for p, kernel in names.items()}  # fmt: skip


def _measure(args, seq: int, causal: bool, rows: list[dict]) -> None:
    """Append the rows of one (length, causal) shape: references first, then every step."""
    import torch
    from analysis.accounting import attention_flops
    from flashattn.sm90.launch import backward, forward
    from flashattn.sm90.tiles import TILES
    from harness.timing import do_bench
    from torch.nn.attention import SDPBackend

    from flashattn_bench.util import DTYPES, sdpa

    dtype = DTYPES[args.dtype]
    kv_heads = args.kv_heads or args.heads
    table = TILES[args.head_dim]
    gen = torch.Generator(device="cuda").manual_seed(seq)
    d, scale = args.head_dim, args.head_dim**-0.5
    shape_q, shape_k = (args.batch, args.heads, seq, d), (args.batch, kv_heads, seq, d)
    q, do = (torch.randn(shape_q, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(shape_k, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    flops = attention_flops(args.batch, args.heads, seq, seq, args.head_dim, causal=causal)

    def row(step, pas, ms, err=math.nan):
        tflops = flops * FLOP_FACTOR.get(pas, 1.0) / ms / 1e9
        rows.append({"seq": seq, "causal": causal, "pass": pas, "step": step, "ms": ms, "tflops": tflops,
                     "err_vs_cudnn": err})  # fmt: skip
        print(
            f"S={seq} causal={causal} {pas} {step}: {ms:.3f} ms {tflops:.0f} TFLOP/s err {err:.1e}",
            flush=True,
        )

    def record(step, pas, fn, err=math.nan):
        row(step, pas, do_bench(fn, "cuda", warmup_ms=50, rep_ms=args.rep_ms), err)

    gqa = kv_heads < args.heads
    refs = {"sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, enable_gqa=gqa),
            "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION, enable_gqa=gqa),
            "portable": _kernel_sets("portable"), "sm90": _kernel_sets("sm90")}  # fmt: skip
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

    def attempt(step, run):
        try:
            run()
        except Exception as exc:  # a tile that does not fit (shared memory, registers) is reported, not fatal
            print(
                f"S={seq} causal={causal} {step}: failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True
            )

    for name in args.gluon_steps:
        tile = table.forward._replace(**VARIANTS[name])

        def run_forward(tile=tile, name=name):
            o_step, _ = forward(q, k, v, causal, None, scale, tile)
            record(f"gluon-{name}", "fwd", lambda: forward(q, k, v, causal, None, scale, tile),
                   _rel_err(o_step, gold["o"]))  # fmt: skip

        attempt(f"gluon-{name}", run_forward)
    o, lse = forward(q, k, v, causal, None, scale)
    for name in args.gluon_bwd_steps:
        dq_changes, dkdv_changes = BACKWARD_STEPS[name]
        tiles = {"dq_tile": table.dq._replace(**dq_changes), "dkdv_tile": table.dkdv._replace(**dkdv_changes)}

        def run_backward(tiles=tiles, name=name):
            step = lambda: backward(q, k, v, o, lse, do, causal, None, scale, **tiles)
            record(f"gbwd-{name}", "bwd", step, grads_err(step()))
            if args.kernels:  # each kernel inside the step's backward, in tile products: dQ 3, dK/dV 4
                for pas, ms in kernel_ms(step, KERNEL_NAMES).items():
                    row(f"gbwd-{name}", pas, ms)

        attempt(f"gbwd-{name}", run_backward)


def _with_ratios(rows: list[dict], args):
    """The table with fwd+bwd sums of whole implementations, and ratios to cuDNN and the portable kernels."""
    import pandas as pd
    from analysis.accounting import attention_flops

    table = pd.DataFrame(rows)
    whole = table[table.step.isin(REFERENCES)]
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from flashattn_bench.util import require_cuda

    require_cuda("flashattn_bench.sm90")
    import torch
    from flashattn.sm90.launch import device_reason
    from harness.results import to_markdown, write_table

    if (reason := device_reason(torch.device("cuda"))) is not None:
        raise SystemExit(f"flashattn_bench.sm90 times the sm90 kernels: {reason}")

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
