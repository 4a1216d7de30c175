"""ZeRO-1's two modes on the same model: bytes each rank sends per step, and the time of the step's
communication and update, on CPU processes (gloo) or GPUs (NCCL).

    python -m parallel_bench.zero_modes --world-size 2 --backend gloo --out results

Model: ``--layers`` square ``nn.Linear`` layers of width ``--width`` (fp32). Every rank holds its own random
gradients (what a backward pass would leave), then one optimizer step of ``torch.optim.AdamW`` through
``parallel.ShardedOptimizer``:

- ``broadcast``: the gradients are averaged first by one all-reduce of all of them in one flat buffer (the
  best case of a DDP wrapper), then the step broadcasts every parameter from its owner;
- ``reduce_scatter`` (true ZeRO-1): the step reduce-scatters the local gradients, updates the owned
  parameters and all-gathers them.

Bytes: every collective of the step is recorded (``torch.distributed`` calls and their tensor sizes) and
converted to bytes sent per rank by the ring-algorithm formulas of ``analysis.collectives`` (a broadcast
counted as its share of an all-gather of the parameters, ``(N-1)/N`` of its size); the sends of
``ShardedOptimizer``'s own ring on gloo count as their size. Time: wall clock from a
barrier to the end of the step (gradient averaging included), the two modes alternating round by round,
median over ``--rounds``; ``vs_broadcast`` is the ratio of medians. The two modes must leave identical
parameters (checked).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path

from harness import cli

MODES = ("broadcast", "reduce_scatter")
COLLECTIVES = {"all_reduce": "all_reduce", "reduce_scatter_tensor": "reduce_scatter",
               "all_gather_into_tensor": "all_gather", "broadcast": "broadcast", "isend": "send"}


@contextlib.contextmanager
def _recording(calls: list):
    """Record ``(kind, bytes)`` of every call in ``COLLECTIVES`` made through ``torch.distributed``."""
    import torch
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def recorded(name):
        def call(*args, **kwargs):
            tensors = [a for a in args if torch.is_tensor(a)]
            big = max(tensors, key=lambda t: t.numel())  # the full-size side (input of a reduce-scatter)
            calls.append((COLLECTIVES[name], big.numel() * big.element_size()))
            return originals[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, recorded(name))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _bytes_sent(calls: list, world_size: int) -> float:
    """Bytes one rank sends for ``calls`` under the ring algorithms."""
    from analysis.collectives import N, S, bytes_sent_per_device

    total = 0.0
    for kind, size in calls:
        if kind == "send":  # point to point (the gloo ring of ShardedOptimizer): exactly what leaves the rank
            total += size
            continue
        formula = bytes_sent_per_device("all_gather" if kind == "broadcast" else kind)
        total += float(formula.subs({N: world_size, S: size}))
    return total


def _worker(rank: int, world_size: int, width: int, layers: int, rounds: int) -> dict:
    import torch
    import torch.distributed as dist
    from parallel.zero import ShardedOptimizer

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    models, optimizers = {}, {}
    for mode in MODES:
        torch.manual_seed(0)
        models[mode] = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers))).to(device)
        optimizers[mode] = ShardedOptimizer(models[mode].parameters(), torch.optim.AdamW, mode=mode, lr=1e-3)
    times = {mode: [] for mode in MODES}
    calls = {}
    for step in range(rounds + 1):  # the first round warms up (allocations, AdamW's lazy state) and counts
        gen = torch.Generator(device).manual_seed(1000 * step + rank)
        grads = [torch.randn(p.shape, generator=gen, device=device) for p in models[MODES[0]].parameters()]
        for mode in MODES if step % 2 == 0 else MODES[::-1]:
            params = list(models[mode].parameters())
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            recorder = _recording(calls.setdefault(mode, [])) if step == 0 else contextlib.nullcontext()
            dist.barrier()
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with recorder:
                if mode == "broadcast":
                    flat = torch.cat([p.grad.reshape(-1) for p in params])
                    dist.all_reduce(flat)
                    flat.div_(world_size)
                    chunks = flat.split([p.numel() for p in params])
                    torch._foreach_copy_([p.grad for p in params],
                                         [c.view_as(p) for c, p in zip(chunks, params, strict=True)])
                optimizers[mode].step()
            if device != "cpu":
                torch.cuda.synchronize()
            if step > 0:
                times[mode].append(time.perf_counter() - start)
            optimizers[mode].zero_grad()
    same = all(torch.equal(a, b) for a, b in zip(*(models[m].parameters() for m in MODES), strict=True))
    parameters = sum(p.numel() for p in models[MODES[0]].parameters())
    return dict(times=times, calls=calls, same=same, parameters=parameters)


def main(argv: list[str] | None = None):
    p = cli.command_parser("python -m parallel_bench.zero_modes", __doc__)
    p.add_argument("--world-size", type=cli.positive_int, default=2, help="processes")
    p.add_argument("--width", type=cli.positive_int, default=1000, help="width of each square Linear layer")
    p.add_argument("--layers", type=cli.positive_int, default=8, help="Linear layers")
    p.add_argument("--rounds", type=cli.positive_int, default=20, help="timed steps of each mode")
    cli.add_out(p, "results", "folder for zero-modes.csv/.md")
    cli.add_launch(p, timeout=300)
    args = p.parse_args(argv)
    try:
        args.backend = cli.resolve_backend(args.backend, args.world_size)
    except ValueError as err:
        p.error(f"--world-size: {err}")

    import pandas as pd
    from harness.results import to_markdown
    from parallel.launch import spawn

    from parallel_bench.results import write_results

    print(f"{args.layers} x Linear({args.width}, {args.width}) on {args.world_size} {args.backend} "
          f"processes, {args.rounds} rounds", flush=True)
    results = spawn(_worker, args.world_size, args.width, args.layers, args.rounds, backend=args.backend,
                    timeout=args.timeout)
    if not all(r["same"] for r in results):
        raise SystemExit("the two modes left different parameters")
    rows = []
    for mode in MODES:
        slowest = [max(ts) for ts in zip(*(r["times"][mode] for r in results), strict=True)]
        calls = results[0]["calls"][mode]
        rows.append(dict(mode=mode, parameters=results[0]["parameters"], world_size=args.world_size,
                         backend=args.backend, collectives=len(calls),
                         bytes_sent_per_rank_MB=_bytes_sent(calls, args.world_size) / 1e6,
                         step_ms_median=1e3 * statistics.median(slowest),
                         step_ms_min=1e3 * min(slowest)))
    df = pd.DataFrame(rows)
    reference = df.set_index("mode").loc["broadcast"]
    df["bytes_vs_broadcast"] = df["bytes_sent_per_rank_MB"] / reference["bytes_sent_per_rank_MB"]
    df["time_vs_broadcast"] = df["step_ms_median"] / reference["step_ms_median"]
    write_results(df, Path(args.out) / "zero-modes")
    print(to_markdown(df))
    return df


if __name__ == "__main__":
    main()
