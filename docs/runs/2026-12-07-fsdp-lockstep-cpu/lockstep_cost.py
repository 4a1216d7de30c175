"""What ``FSDP(check_lockstep=...)`` costs on 2 gloo ranks on the CPU: exchanges per steady step, the time of
one exchange, and the step time of each mode.

    uv run python docs/runs/2026-12-07-fsdp-lockstep-cpu/lockstep_cost.py \
        --out docs/runs/2026-12-07-fsdp-lockstep-cpu/raw --rounds 25

Model: ``BasicsTransformerLM`` (vocab 503, context 64, d_model 64, 8 layers, 4 heads, d_ff 160) under
``FSDP(unit_modules=(TransformerBlock,))``: 10 units (embedding, 8 blocks, LM head), the final norm
replicated.
One exchange is timed on its own as ``parallel.lockstep`` issues it (an all-reduce of 4 int64 values in the
gloo check group), median of ``--exchanges`` calls. Step time: forward, loss, backward,
``finish_gradient_synchronization``, SGD step; the modes alternate round by round (``--rounds`` rounds of
``--steps`` steps after 3 warm-up steps each), median over rounds of the slower rank's mean step.
Writes ``lockstep-cost.csv`` (one row per mode) into ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

MODES = ("never", "on_change", "always")
CONFIG = dict(vocab_size=503, context_length=64, d_model=64, num_layers=8, num_heads=4, d_ff=160)


def _worker(rank: int, world_size: int, rounds: int, steps: int, exchanges: int) -> dict:
    import torch
    import torch.distributed as dist
    from cs336_basics.model import BasicsTransformerLM, TransformerBlock
    from cs336_basics.nn_utils import cross_entropy
    from parallel.fsdp import FSDP
    from parallel.grad_presence import check_group

    torch.set_num_threads(1)
    group = check_group()
    buf = torch.zeros(4, dtype=torch.int64)
    for _ in range(20):
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
    times = []
    for _ in range(exchanges):
        start = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
        times.append(time.perf_counter() - start)
    exchange_ms = 1e3 * statistics.median(times)

    models, counts, step_ms = {}, {}, {m: [] for m in MODES}
    for mode in MODES:
        torch.manual_seed(0)
        fsdp = FSDP(BasicsTransformerLM(**CONFIG), unit_modules=(TransformerBlock,), check_lockstep=mode)
        models[mode] = (fsdp, torch.optim.SGD(fsdp.parameters(), lr=0.1))
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, CONFIG["vocab_size"], (4, CONFIG["context_length"] + 1), generator=gen)

    def step(mode: str) -> None:
        fsdp, opt = models[mode]
        cross_entropy(fsdp(ids[:, :-1]), ids[:, 1:]).backward()
        fsdp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()

    original = dist.all_reduce
    for mode in MODES:  # warm-up, then count one steady step's exchanges
        for _ in range(3):
            step(mode)
        seen: list[bool] = []

        def counted(*a, seen=seen, **k):
            seen.append(k.get("group") is group)
            return original(*a, **k)

        dist.all_reduce = counted
        try:
            step(mode)
        finally:
            dist.all_reduce = original
        counts[mode] = sum(seen)
    for _ in range(rounds):
        for mode in MODES:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step(mode)
            step_ms[mode].append(1e3 * (time.perf_counter() - start) / steps)
    return dict(exchange_ms=exchange_ms, counts=counts, step_ms=step_ms)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for lockstep-cost.csv")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of alternating modes (default 15)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode and round (default 10)")
    parser.add_argument("--exchanges", type=int, default=2000, help="exchanges timed alone (default 2000)")
    args = parser.parse_args(argv)
    import pandas as pd
    import torch
    from parallel.launch import spawn

    ranks = spawn(_worker, 2, args.rounds, args.steps, args.exchanges, backend="gloo", timeout=1800)
    exchange_ms = max(r["exchange_ms"] for r in ranks)
    rounds = {m: [max(r["step_ms"][m][i] for r in ranks) for i in range(args.rounds)] for m in MODES}
    never = statistics.median(rounds["never"])
    rows = []
    for mode in MODES:
        median = statistics.median(rounds[mode])
        rows.append(dict(mode=mode, units=10, exchanges_per_steady_step=ranks[0]["counts"][mode],
                         exchange_ms=exchange_ms, step_ms_median=median, step_ms_min=min(rounds[mode]),
                         step_ms_max=max(rounds[mode]), vs_never=median / never,
                         ranks=2, backend="gloo", torch=torch.__version__, rounds=args.rounds,
                         steps=args.steps,
                         utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime())))
    df = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "lockstep-cost.csv.partial"
    df.to_csv(tmp, index=False)
    tmp.replace(args.out / "lockstep-cost.csv")
    print(df.to_markdown(index=False))


if __name__ == "__main__":
    main()
