"""Training step of ``parallel.FSDP`` against PyTorch's FSDP2 (``fully_shard``) on the same model, in one run.

    python -m parallel_bench.fsdp --preset xl --out docs

Both shard a ``cs336_basics`` preset built on the meta device (SDPA attention) per TransformerBlock, compute
in BF16 with fp32 master weights, reduce gradients in fp32 and step ``torch.optim.AdamW(foreach=True)`` on
the fp32 shards: ours as ``FSDP(model, compute_dtype=bf16, unit_modules=(TransformerBlock,))`` (embedding
and LM head are units of their own, the final norm replicated), FSDP2 as ``fully_shard`` on every block and
on the root with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``. Each rank trains on a fixed
random batch of ``--batch-size`` sequences of the preset's context.

Step time: CUDA events around forward, loss, backward, gradient synchronization and optimizer step; median
over ``--steps`` timed steps (after ``--warmup``) of the slower rank; ``vs_fsdp2`` is the ratio. Peak memory:
``torch.cuda.max_memory_allocated`` over the timed steps (the larger rank). TFLOP/s per GPU uses
``analysis.accounting.train_step_flops``. Evidence of overlap: for ours, every all-gather of the last timed
step is timed against the moment the compute stream needed it (``GatherTimer``, an observer of
``FSDP.register_gather_observer``); then one profiled step
of each implementation (``torch.profiler``) is drawn as kernels per CUDA stream.

Writes into ``--out``: ``fsdp.csv``, ``fsdp.md``, ``fsdp-gathers.csv``, ``fsdp-trace-<impl>.json.gz`` and
``figures/fsdp-timeline.png``. Needs 2+ CUDA GPUs (NCCL).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from parallel_bench.zero import GIB, parse_run_arguments

if TYPE_CHECKING:
    import pandas as pd

IMPLS = ("ours", "fsdp2")


def _tables(preset: str, batch: int, world_size: int, per_rank: list[list[dict]]):
    import pandas as pd
    from analysis.accounting import fsdp_memory_per_rank, train_step_flops
    from cs336_basics.presets import get_preset

    config = get_preset(preset)
    flops = train_step_flops(config, batch, config.context_length)
    state = fsdp_memory_per_rank(config, world_size, compute_bytes=2)
    rows = []
    for i, impl in enumerate(IMPLS):
        step_ms = statistics.median(max(ts) for ts in zip(*(r[i]["times"] for r in per_rank), strict=True))
        rows.append(dict(impl=impl, preset=preset, batch_per_gpu=batch, step_ms=step_ms,
                         tflops_per_gpu=flops / (step_ms / 1e3) / 1e12,
                         peak_GiB=max(r[i]["peak"] for r in per_rank) / GIB,
                         expected_sharded_state_GiB=(state.parameters + state.gradients
                                                     + state.optimizer_state) / GIB))
    df = pd.DataFrame(rows)
    ref = df.set_index("impl").loc["fsdp2"]
    df["vs_fsdp2_time"] = df["step_ms"] / ref["step_ms"]
    df["vs_fsdp2_memory"] = df["peak_GiB"] / ref["peak_GiB"]
    gathers = pd.DataFrame([dict(rank=rank, **g) for rank, r in enumerate(per_rank) for g in r[0]["gathers"]])
    return df, gathers


def gather_summary(gathers: pd.DataFrame) -> pd.DataFrame:
    """Per rank and phase: gathers, how many finished before needed, and the worst and median lateness."""
    import pandas as pd

    grouped = gathers.groupby(["rank", "phase"])["late_ms"]
    return pd.DataFrame({
        "gathers": grouped.size(),
        "finished_before_needed": grouped.apply(lambda s: int((s <= 0).sum())),
        "median_late_ms": grouped.median(),
        "max_late_ms": grouped.max(),
        "total_stall_ms": grouped.apply(lambda s: float(s.clip(lower=0).sum())),
    }).reset_index()


PHASES = ("forward", "backward", "optimizer")


def plot_step_timelines(out: Path, title: str) -> dict[str, dict]:
    """``figures/fsdp-timeline.png`` from the traces in ``out``, shading only the step's three phases.

    FSDP2 and the optimizer open many ``record_function`` ranges of their own; they are left out of the
    figure (not out of the trace files) so that the phases stay readable.
    """
    from harness.trace import load_trace

    from parallel_bench.trace_plot import plot_timelines

    with tempfile.TemporaryDirectory() as tmp:
        traces = {}
        for impl in IMPLS:
            ranges = ("user_annotation", "gpu_user_annotation")
            events = [e for e in load_trace(out / f"fsdp-trace-{impl}.json.gz")
                      if e.get("cat") not in ranges or e.get("name") in PHASES]
            traces[impl] = Path(tmp) / f"{impl}.json"
            traces[impl].write_text(json.dumps({"traceEvents": events}))
        return plot_timelines(traces, out / "figures" / "fsdp-timeline.png", title=title)


def main(argv: list[str] | None = None) -> pd.DataFrame | None:
    args = parse_run_arguments("python -m parallel_bench.fsdp", __doc__, argv, warmup=3, steps=6,
                               out_help="folder of tables, traces, figures", replot=True)
    title = f"{args.preset}, BF16, {args.world_size} GPUs: one training step, rank 0"
    if args.replot:
        for impl, s in plot_step_timelines(args.out, title).items():
            print(f"{impl}: {s}")
        return None
    from harness.results import to_markdown, write_table
    from parallel.launch import spawn

    from parallel_bench.fsdp_steps import worker
    from parallel_bench.results import write_results

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{args.preset}: ours and FSDP2, {args.warmup}+{args.steps} steps on {args.world_size} GPUs",
          flush=True)
    per_rank = spawn(worker, args.world_size, IMPLS, args.preset, args.batch_size, args.warmup, args.steps,
                     args.out, backend="nccl", timeout=args.timeout)
    df, gathers = _tables(args.preset, args.batch_size, args.world_size, per_rank)
    summary = gather_summary(gathers)
    write_results(df, args.out / "fsdp", summary)
    write_table(gathers, args.out / "fsdp-gathers", formats=("csv",))
    plot_step_timelines(args.out, title)
    print(to_markdown(summary))
    print(to_markdown(df))
    return df


if __name__ == "__main__":
    main()
