"""Memory and step time of data-parallel training with and without ZeRO-1 optimizer-state sharding.

    python -m parallel_bench.zero --preset xl --out docs

Each rank builds the preset in fp32 (``cs336_basics``, SDPA attention), wraps it in torch's
``DistributedDataParallel(gradient_as_bucket_view=True)`` (so gradients live in its buckets, one copy) and
trains with ``torch.optim.AdamW`` either plainly (``unsharded``) or through ``parallel.ShardedOptimizer``
(``zero1``, ``mode="broadcast"``: DDP averages the gradients), on a fixed random batch of ``--batch-size``
sequences of the preset's context per GPU. (``python -m parallel_bench.zero_modes`` compares the two modes.)

Memory (``torch.cuda`` allocator, per rank, GiB): allocated after model creation; allocated and peak just
before the optimizer step (after backward) and just after it, in the last timed step; and the bytes of
parameters, gradients and optimizer state counted from the tensors themselves, each set against the analytic
figure of ``analysis.accounting`` (fp32 weights and gradients, 8 bytes of AdamW state per parameter, split
1/N under ZeRO-1). Each mode runs in its own freshly started processes. Step time: CUDA events around
forward, backward, optimizer step and parameter broadcast, median over ``--steps`` timed steps of the
slower rank; ``vs_unsharded`` is the ratio.

Writes ``zero.csv`` and ``zero.md`` into ``--out``. Needs 2+ CUDA GPUs (NCCL).
"""

from __future__ import annotations

import gc
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from harness import cli

if TYPE_CHECKING:
    import pandas as pd
    import torch

GIB = 2**30
MODES = ("unsharded", "zero1")


def sdpa(q, k, v, is_causal):
    """PyTorch's fused attention on ``(batch, heads, seq, head_dim)``."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def random_batch(config, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets ``(batch, context)``, different on every rank."""
    import torch

    gen = torch.Generator(device).manual_seed(torch.distributed.get_rank())
    shape = (batch, config.context_length + 1)
    ids = torch.randint(0, config.vocab_size, shape, device=device, generator=gen)
    return ids[:, :-1], ids[:, 1:]


def _tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among ``tensors`` (gradient bucket views are counted once)."""
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _run_mode(mode: str, preset: str, batch: int, warmup: int, steps: int) -> dict:
    import torch
    from cs336_basics.nn_utils import cross_entropy
    from cs336_basics.presets import build_model, get_preset
    from harness.timing import Marks
    from parallel.zero import ShardedOptimizer

    config = get_preset(preset)
    device = torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = build_model(config, device=device, attention_fn=sdpa)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index],
                                                    gradient_as_bucket_view=True)
    after_model = torch.cuda.memory_allocated() - base
    if mode == "zero1":
        optimizer = ShardedOptimizer(ddp.parameters(), torch.optim.AdamW, mode="broadcast", lr=1e-5)
    else:
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-5)
    x, y = random_batch(config, batch, device)
    times, memory = [], {}
    for step in range(warmup + steps):
        torch.cuda.reset_peak_memory_stats()
        marks = Marks(device)
        marks.mark()
        cross_entropy(ddp(x), y).backward()
        torch.cuda.synchronize()
        memory["before_step_alloc"] = torch.cuda.memory_allocated() - base
        memory["before_step_peak"] = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        optimizer.step()
        marks.mark()
        torch.cuda.synchronize()
        memory["after_step_alloc"] = torch.cuda.memory_allocated() - base
        memory["after_step_peak"] = torch.cuda.max_memory_allocated() - base
        if step == warmup + steps - 1:  # count the state while gradients still exist
            params = list(ddp.parameters())
            memory["params"] = _tensor_bytes(params)
            memory["grads"] = _tensor_bytes([p.grad for p in params if p.grad is not None])
            state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
            memory["optimizer_state"] = _tensor_bytes([v for v in state if v.dim() > 0])
        optimizer.zero_grad(set_to_none=False)
        if step >= warmup:
            times.append(marks.elapsed_ms(0, 1))
    del ddp, model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return dict(mode=mode, after_model=after_model, times=times, **memory)


def _worker(rank: int, world_size: int, mode: str, preset: str, batch: int, warmup: int, steps: int) -> dict:
    result = _run_mode(mode, preset, batch, warmup, steps)
    if rank == 0:
        print(f"  {mode}: {statistics.median(result['times']):.0f} ms/step, optimizer state "
              f"{result['optimizer_state'] / GIB:.2f} GiB on rank 0", flush=True)
    return result


def _table(preset: str, world_size: int, per_mode: list[list[dict]]) -> pd.DataFrame:
    """One row per mode and rank; ``per_mode[i][rank]`` is ``_run_mode``'s result for ``MODES[i]``."""
    import pandas as pd
    from analysis.accounting import memory_breakdown, sharded_optimizer_state_bytes
    from cs336_basics.presets import get_preset

    config = get_preset(preset)
    expected = memory_breakdown(config, 1, config.context_length)
    rows = []
    for i, mode in enumerate(MODES):
        step_ms = statistics.median(max(ts) for ts in zip(*(r["times"] for r in per_mode[i]), strict=True))
        expected_state = (sharded_optimizer_state_bytes(config, world_size) if mode == "zero1"
                          else expected.optimizer_state)
        for rank, r in enumerate(per_mode[i]):
            rows.append({
                "mode": mode, "rank": rank, "step_ms": step_ms,
                "after_model_GiB": r["after_model"] / GIB,
                "before_step_alloc_GiB": r["before_step_alloc"] / GIB,
                "before_step_peak_GiB": r["before_step_peak"] / GIB,
                "after_step_alloc_GiB": r["after_step_alloc"] / GIB,
                "after_step_peak_GiB": r["after_step_peak"] / GIB,
                "params_GiB": r["params"] / GIB, "expected_params_GiB": expected.parameters / GIB,
                "grads_GiB": r["grads"] / GIB, "expected_grads_GiB": expected.gradients / GIB,
                "optimizer_state_GiB": r["optimizer_state"] / GIB,
                "expected_optimizer_state_GiB": expected_state / GIB,
            })
    df = pd.DataFrame(rows)
    df["vs_unsharded"] = df["step_ms"] / df.loc[df["mode"] == "unsharded", "step_ms"].iloc[0]
    return df


def parse_run_arguments(prog: str, doc: str, argv: list[str] | None, warmup: int, steps: int,
                        out_help: str, replot: bool = False):
    """The options both sharding benchmarks share (``replot``: add ``--replot``), parsed before torch is
    imported; exits unless enough GPUs are present for a measuring run."""
    parser = cli.command_parser(prog, doc)
    parser.add_argument("--preset", default="xl", help="cs336_basics preset")
    parser.add_argument("--batch-size", type=cli.positive_int, default=4,
                        help="sequences per GPU (preset context length)")
    parser.add_argument("--world-size", type=cli.positive_int, default=2,
                        help="GPUs (one process each, NCCL)")
    cli.add_steps(parser, steps=steps, warmup=warmup)
    parser.add_argument("--timeout", type=cli.positive_float, default=500,
                        help="seconds before the workers are stopped")
    parser.add_argument("--out", type=Path, default=Path("docs"), help=out_help)
    if replot:
        parser.add_argument("--replot", action="store_true",
                            help="only redraw the figure from the traces already in --out (no GPU needed)")
    args = parser.parse_args(argv)
    if not getattr(args, "replot", False):
        import torch

        if torch.cuda.device_count() < args.world_size:
            raise SystemExit(f"needs {args.world_size} CUDA GPUs, found {torch.cuda.device_count()}")
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_run_arguments("python -m parallel_bench.zero", __doc__, argv, warmup=2, steps=3,
                               out_help="folder for zero.csv and zero.md")
    from harness.results import to_markdown
    from parallel.launch import spawn

    from parallel_bench.results import write_results

    print(f"{args.preset}: {len(MODES)} modes of {args.warmup}+{args.steps} steps on {args.world_size} GPUs",
          flush=True)
    per_mode = [  # a fresh set of processes per mode: nothing of one mode's memory is left for the next
        spawn(_worker, args.world_size, mode, args.preset, args.batch_size, args.warmup, args.steps,
              backend="nccl", timeout=args.timeout)
        for mode in MODES
    ]
    df = _table(args.preset, args.world_size, per_mode)
    write_results(df, args.out / "zero")
    print(to_markdown(df[["mode", "rank", "step_ms", "vs_unsharded", "after_model_GiB",
                             "before_step_peak_GiB", "after_step_peak_GiB", "optimizer_state_GiB",
                             "expected_optimizer_state_GiB"]]))
    return df


if __name__ == "__main__":
    main()
