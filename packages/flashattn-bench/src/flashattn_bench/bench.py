"""Attention latency: our FlashAttention-2 against naive PyTorch, SDPA's flash and cuDNN backends and, where
installed, FlashAttention-4.

Implementations (:mod:`flashattn_bench.implementations`): ``ours`` (:func:`flashattn.flash_attention`, the
public path: on H100 / H200 the sm90 Gluon kernels where they cover the call, else the portable Triton
kernels), ``portable`` (the portable kernels for both passes), ``gluon`` (the sm90 forward with the portable
backward), ``gluon_bwd`` (the sm90 forward and backward, what ``ours`` runs on sm90; only when named),
``fa4`` and ``fa4_det`` (FlashAttention-4's ``flash_attn.cute``, its default and its deterministic backward,
timed on ``(B, S, H, d)`` tensors, its own layout; skipped with a note where it does not import), ``naive``,
``sdpa_flash``, ``sdpa_cudnn``. A named kernel set that cannot take a call runs the public path's plan.
Three tables, each with forward, backward and forward+backward latency (``triton.testing.do_bench`` median,
ms), TFLOP/s (``analysis.accounting.attention_flops``) and speed ratios measured in the same run:
- ``multihead``: (1, 32 heads, S, 128) for S in ``--multihead-seqs`` (4096 ... 65 536) and (4, 16, 4096, 64),
  causal and not, and GQA (1, 32 query / 8 K/V heads, 8192, 128) causal (SDPA on K/V expanded, untimed), bf16;
- ``sweep``: batch 1, one head, causal, seq 128 ... 65 536 (powers of two) x head dim 16 ... 128 x bf16, fp32;
- ``features`` (:mod:`flashattn_bench.features`): grouped-query attention, head dim 256, packed documents and
  a sliding window, each against its reference, with the target it is held to.
Cells that cannot run are marked, never fatal: ``OOM`` (out of memory, or naive attention whose score matrices
would not fit by the analytic count), ``unsupported`` (SDPA's flash and cuDNN and FlashAttention-4 have no
fp32 kernels), ``failed (...)`` (FlashAttention-4 refusing a shape). Ratios are ``other ms / ours ms``: above
1 means ours is faster. Each table is written as CSV and Markdown under ``--out``.

Usage: ``python -m flashattn_bench.bench --out results/`` (``--quick``: a small subset; ``--only features``).
"""

import argparse
from pathlib import Path

from harness import cli

IMPLEMENTATION_NAMES = (
    "ours", "portable", "gluon", "gluon_bwd", "fa4", "fa4_det", "naive", "sdpa_flash", "sdpa_cudnn",
)  # fmt: skip
# not by default: gluon_bwd is what ours runs on sm90
DEFAULT_IMPLEMENTATIONS = [n for n in IMPLEMENTATION_NAMES if n != "gluon_bwd"]
TABLES = ("multihead", "sweep", "features")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.command_parser("python -m flashattn_bench.bench", __doc__)
    cli.add_out(p, "flashattn-bench", "folder for tables and plot")
    cli.add_list(p, "--seqs", cli.positive_int, [2**i for i in range(7, 17)], "sweep lengths")
    cli.add_list(p, "--multihead-seqs", cli.positive_int, [4096, 8192, 16384, 32768, 65536],
                 "lengths S of the multihead table's (1, 32, S, 128) rows")  # fmt: skip
    cli.add_list(p, "--head-dims", cli.positive_int, [16, 32, 64, 128], "sweep head dims")
    cli.add_dtypes(p, ["bf16", "fp32"], help="sweep dtypes")
    cli.add_list(p, "--impls", str, DEFAULT_IMPLEMENTATIONS,
                 "implementations to time (ours is needed for the ratio columns; fa4 and fa4_det only where "
                 "flash_attn.cute imports)", choices=IMPLEMENTATION_NAMES)  # fmt: skip
    p.add_argument("--warmup-ms", type=cli.positive_float, default=5.0,
                   help="do_bench warm-up time per measurement (ms)")  # fmt: skip
    p.add_argument("--rep-ms", type=cli.positive_float, default=20.0,
                   help="do_bench repetition time per measurement (ms)")  # fmt: skip
    cli.add_list(p, "--only", str, TABLES, "tables to measure", choices=TABLES)
    p.add_argument("--quick", action="store_true", help="sweep only seq <= 4096, d in {64, 128}")
    p.add_argument(
        "--jobs", type=cli.positive_int, default=12, help="parallel processes compiling our kernels first"
    )
    args = p.parse_args(argv)
    args.out = Path(args.out)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick:
        args.seqs = [s for s in args.seqs if s <= 4096]
        args.head_dims = [d for d in args.head_dims if d >= 64]
    from flashattn_bench.util import require_cuda

    require_cuda("flashattn_bench.bench")
    from flashattn_bench.tables import run

    run(args)


if __name__ == "__main__":
    main()
