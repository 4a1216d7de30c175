"""Host time per call of ``flashattn.flash_attention``'s forward: the median CPU time of 1000 eager calls at a
small CUDA shape, where the GPU work is shorter than the host's, so the host is what is timed.

Usage: ``python docs/runs/2026-12-07-flashattn-library/host_time.py [--label NAME]``; it uses only the public
name, so the same script times any version of the package on ``PYTHONPATH``.
"""

import argparse
import statistics
import time

import torch
from flashattn import flash_attention


def host_times_us(shape, dtype, causal: bool, calls: int, rounds: int) -> list[float]:
    """Per round, the mean CPU microseconds of ``calls`` back-to-back forward calls (no sync inside)."""
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    with torch.no_grad():
        for _ in range(20):
            flash_attention(q, k, v, causal)
        torch.cuda.synchronize()
        rounds_us = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                flash_attention(q, k, v, causal)
            rounds_us.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return rounds_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="flashattn", help="the name printed on each row")
    parser.add_argument("--calls", type=int, default=1000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (the median is reported)")
    args = parser.parse_args()
    for shape, dtype in (((1, 4, 128, 64), torch.bfloat16), ((1, 4, 128, 128), torch.bfloat16)):
        for causal in (True, False):
            times = host_times_us(shape, dtype, causal, args.calls, args.rounds)
            print(f"{args.label},{shape},{str(dtype)[6:]},causal={causal},median_us={statistics.median(times):.1f},"
                  f"min_us={min(times):.1f},max_us={max(times):.1f}", flush=True)


if __name__ == "__main__":
    main()
