"""Naive PyTorch attention, eager and ``torch.compile``d: time and memory against length and head dim.

Batch 8, one head (inputs ``(8, seq, d)``), head dim in {16, 32, 64, 128} x seq in {256, 1024, 4096, 8192,
16384}: warm-up, then ``--iters`` forward passes (autograd on, as in training) and ``--iters`` backward passes
through one retained graph, each loop synchronised and timed with the host clock; the memory allocated before
the backward (inputs plus what autograd saved) is read after one forward. Out-of-memory cells are marked
``OOM``. Beside the measurement: the analytic bytes of the saved score-sized tensors, and the smallest length
whose forward+backward would not fit on this device by that count.

Usage: ``python -m flashattn_bench.pytorch_attention --out results/``.
"""

import math
import time
from itertools import product
from pathlib import Path

from harness import cli

# Non-causal forward saves, per (batch, head), the probabilities (softmax output, read by both of its
# backward products) and the softmax's own output again for its gradient: autograd keeps one (S x S) tensor
# shared by the two, and the scaled scores are freed. Backward then holds the probability gradient and the
# score gradient as well: three (S x S) tensors at its peak.
SAVED_SCORE_TENSORS = 1
PEAK_SCORE_TENSORS = 3


def measure(attend, batch: int, seq: int, head_dim: int, dtype, iters: int, warmup: int) -> dict:
    """Per-pass forward and backward ms and the memory allocated before backward (GiB), or an OOM status."""
    import torch
    from harness.timing import back_to_back

    row = {"fwd ms": math.nan, "bwd ms": math.nan, "mem before bwd GiB": math.nan, "status": "ok"}
    try:
        q, k, v = (
            torch.randn(batch, seq, head_dim, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        do = torch.randn(batch, seq, head_dim, device="cuda", dtype=dtype)
        for _ in range(warmup):
            attend(q, k, v).backward(do)
        row["fwd ms"] = back_to_back(lambda: attend(q, k, v), iters, "cuda") * 1e3
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        o = attend(q, k, v)
        torch.cuda.synchronize()
        row["mem before bwd GiB"] = torch.cuda.memory_allocated() / 2**30
        row["saved by autograd GiB"] = (torch.cuda.memory_allocated() - before) / 2**30
        row["bwd ms"] = back_to_back(lambda: o.backward(do, retain_graph=True), iters, "cuda") * 1e3
    except torch.OutOfMemoryError:
        row["status"] = "OOM"
    finally:
        q = k = v = do = o = None
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> None:
    p = cli.command_parser("python -m flashattn_bench.pytorch_attention", __doc__)
    cli.add_out(p, "flashattn-pytorch", "folder for the tables")
    p.add_argument("--batch", type=cli.positive_int, default=8, help="batch size (one head)")
    cli.add_list(p, "--seqs", cli.positive_int, [256, 1024, 4096, 8192, 16384], "lengths")
    cli.add_list(p, "--head-dims", cli.positive_int, [16, 32, 64, 128], "head dims")
    p.add_argument("--dtype", choices=cli.DTYPE_NAMES, default="fp32", help="input dtype")
    p.add_argument("--iters", type=cli.positive_int, default=100,
                   help="timed forward and backward passes per cell")  # fmt: skip
    p.add_argument("--warmup", type=cli.non_negative_int, default=5,
                   help="untimed forward+backward passes per cell")  # fmt: skip
    args = p.parse_args(argv)
    from flashattn_bench.util import require_cuda

    require_cuda("flashattn_bench.pytorch_attention")
    import pandas as pd
    import torch
    from flashattn.plain import naive_attention
    from harness.environment import environment
    from harness.results import to_markdown, write_table

    from flashattn_bench.util import DTYPES

    dtype = DTYPES[args.dtype]
    env = environment()
    total = torch.cuda.get_device_properties(0).total_memory
    print(env, f"{total / 2**30:.1f} GiB", flush=True)
    # Backward is timed by replaying one retained graph; compiled backward graphs otherwise donate (reuse)
    # their saved buffers, which forbids retain_graph.
    torch._functorch.config.donated_buffer = False
    variants = {"eager": naive_attention, "compiled": torch.compile(naive_attention)}
    rows, start = [], time.perf_counter()
    for (name, fn), head_dim, seq in product(variants.items(), args.head_dims, args.seqs):
        row = measure(lambda q, k, v, fn=fn: fn(q, k, v, False), args.batch, seq, head_dim, dtype, args.iters,
                      args.warmup)  # fmt: skip
        score_bytes = args.batch * seq * seq * dtype.itemsize
        row = {"attention": name, "head_dim": head_dim, "seq": seq, **row,
               "analytic saved GiB": SAVED_SCORE_TENSORS * score_bytes / 2**30,
               "analytic peak GiB": PEAK_SCORE_TENSORS * score_bytes / 2**30}  # fmt: skip
        rows.append(row)
        took = time.perf_counter() - start
        times = f"fwd {row['fwd ms']:.3f} ms, bwd {row['bwd ms']:.3f} ms"
        print(f"[{took:.0f}s] {name} d={head_dim} seq={seq}: {times}, {row['mem before bwd GiB']:.2f} GiB "
              f"{row['status']}", flush=True)  # fmt: skip
        # rewritten after every cell: kept if the run is cut short
        write_table(pd.DataFrame(rows), Path(args.out) / "pytorch_attention", ".3g")
    df = pd.DataFrame(rows)
    seq = max(args.seqs)
    while PEAK_SCORE_TENSORS * args.batch * seq * seq * dtype.itemsize < total:
        seq *= 2
    print(
        f"\nby the analytic count, batch {args.batch} first runs out of {total / 2**30:.0f} GiB at seq {seq}"
    )
    print(to_markdown(df, ".3f"))


if __name__ == "__main__":
    main()
