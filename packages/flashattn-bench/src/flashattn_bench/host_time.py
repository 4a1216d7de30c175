"""Host time per call of the public forward: what the CPU spends in one eager call of
:func:`flashattn.flash_attention` at a small CUDA shape, where the kernels take less time than the launch
path.

Each implementation runs ``--warmup`` untimed calls, then ``--calls`` calls each timed alone with the host
clock (``time.perf_counter_ns`` around the call; nothing waits for the GPU inside the timed loop:
``torch.cuda.synchronize`` runs only before and after it, and the kernels at this shape finish faster than
the calls are issued, so the launch queue never fills). Prints the median, 10th and 90th percentiles in
microseconds; run before and after a change on one machine and compare the medians. ``--impls`` adds other
implementations of :mod:`flashattn_bench.implementations` (e.g. ``sdpa_cudnn``) as a reference measured in the
same process; ``--grad`` times calls on inputs that require gradients (autograd records the graph).

Usage: ``python -m flashattn_bench.host_time`` (default (1, 4, 128, 64) bf16, 1000 calls).
"""

import argparse
import functools
from pathlib import Path

from harness import cli

IMPLEMENTATION_NAMES = ("ours", "portable", "gluon_bwd", "sdpa_cudnn", "sdpa_flash", "fa4")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.command_parser("python -m flashattn_bench.host_time", __doc__)
    p.add_argument("--shape", type=cli.positive_int, nargs=4, default=[1, 4, 128, 64],
                   metavar=("B", "H", "S", "D"),
                   help="q, k, v shape (batch, heads, seq, head dim)")  # fmt: skip
    p.add_argument("--dtype", choices=cli.DTYPE_NAMES, default="bf16", help="input dtype")
    p.add_argument("--causal", action="store_true", help="causal attention")
    p.add_argument("--calls", type=cli.positive_int, default=1000, help="timed calls per implementation")
    p.add_argument("--warmup", type=cli.non_negative_int, default=100,
                   help="untimed calls first (compiles the kernels)")  # fmt: skip
    cli.add_list(p, "--impls", str, ["ours"], "implementations to time (ours: the public flash_attention)",
                 choices=IMPLEMENTATION_NAMES)  # fmt: skip
    p.add_argument("--grad", action="store_true", help="inputs require gradients (forward records autograd)")
    cli.add_out(p, None, "also write <out>.csv and <out>.md")
    return p.parse_args(argv)


def host_times_us(call, calls: int, warmup: int) -> list[float]:
    """Host microseconds of each of ``calls`` calls of ``call()`` after ``warmup`` untimed ones; the GPU is
    synchronised only before and after the timed loop."""
    import time

    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = [0] * calls
    for i in range(calls):
        start = time.perf_counter_ns()
        call()
        times[i] = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return [t / 1e3 for t in times]


def summary(times_us: list[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile (microseconds) of ``times_us``."""
    import statistics

    deciles = statistics.quantiles(times_us, n=10) if len(times_us) > 1 else times_us * 9
    return {"median us": statistics.median(times_us), "p10 us": deciles[0], "p90 us": deciles[-1]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from flashattn_bench.util import require_cuda

    require_cuda("flashattn_bench.host_time")
    import pandas as pd
    import torch
    from flashattn.dispatch import choose
    from harness.environment import environment
    from harness.results import to_markdown, write_table

    from flashattn_bench.implementations import available, implementations
    from flashattn_bench.util import DTYPES

    env = environment()
    print(env, flush=True)
    batch, heads, seq, head_dim = args.shape
    dtype = DTYPES[args.dtype]
    rows = []
    for name, impl in implementations(available(args.impls)).items():
        dims = (batch, seq, heads, head_dim) if impl.layout == "bshd" else tuple(args.shape)
        q, k, v = (torch.randn(dims, device="cuda", dtype=dtype, requires_grad=args.grad) for _ in range(3))
        if name == "ours":
            print(f"ours: {choose(q, k, v, args.causal)}", flush=True)
        call = functools.partial(impl.attend, q, k, v, args.causal)
        with torch.set_grad_enabled(args.grad):
            stats = summary(host_times_us(call, args.calls, args.warmup))
        rows.append({"impl": name, "shape": str(tuple(args.shape)), "dtype": args.dtype,
                     "causal": args.causal, "grad": args.grad, "calls": args.calls, **stats})  # fmt: skip
        print(f"{name}: median {stats['median us']:.1f} us per call (p10 {stats['p10 us']:.1f}, "
              f"p90 {stats['p90 us']:.1f}) over {args.calls} calls", flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    print(to_markdown(table, ".1f"))
    if args.out is not None:
        write_table(table, Path(args.out), ".1f")


if __name__ == "__main__":
    main()
