"""Training step of ``parallel.FSDP`` against PyTorch's FSDP2 (``fully_shard``) on the same model, in one run.

    python -m parallel.bench_fsdp --preset xl --out docs

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

import functools
import gc
import json
import statistics
import tempfile
from pathlib import Path

import pandas as pd
import torch

from parallel.bench_zero import parse_run_arguments, random_batch, sdpa
from parallel.fsdp import FSDP
from parallel.launch import spawn
from parallel.report import environment, markdown_table, write_csv, write_text
from parallel.trace_plot import load_trace, plot_timelines

GIB = 2**30
IMPLS = ("ours", "fsdp2")


class GatherTimer:
    """Times every gather the compute stream waits on against the moment it needed the unit (CUDA events)."""

    def __init__(self):
        self.log: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, index: int, phase: str, ready: torch.cuda.Event) -> None:
        needed = torch.cuda.Event(enable_timing=True)
        needed.record()
        self.log.append((index, phase, needed, ready))

    def slack(self) -> list[dict]:
        """``{unit, phase, late_ms}`` per gather logged: ``late_ms`` from the compute stream reaching the unit
        to the gather finishing (negative: finished early by that much; positive: compute stalled).
        Synchronizes."""
        torch.cuda.synchronize()
        return [{"unit": index, "phase": phase, "late_ms": needed.elapsed_time(ready)}
                for index, phase, needed, ready in self.log]


def _build(impl: str, config, device: torch.device):
    """``(model, optimizer, finish, timer)``: ``finish()`` completes gradient synchronization after backward;
    ``timer`` logs our gathers (None for FSDP2)."""
    from cs336_basics.model import TransformerBlock
    from cs336_basics.presets import build_model

    model = build_model(config, device="meta", attention_fn=sdpa)
    if impl == "ours":
        model = FSDP(model, compute_dtype=torch.bfloat16, unit_modules=(TransformerBlock,))
        timer = GatherTimer()
        model.register_gather_observer(timer)
        finish = model.finish_gradient_synchronization
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        model.to_empty(device=device)
        with torch.no_grad():
            for p in model.parameters():  # values do not change the timing: gains 1, weights small
                local = p.to_local()
                if p.dim() == 1:
                    local.fill_(1.0)
                else:
                    local.normal_(0.0, 0.02)
        finish = _nothing  # FSDP2 waits for its reduce-scatters inside backward
        timer = None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    return model, optimizer, finish, timer


def _nothing() -> None:
    """FSDP2 needs no call after backward."""


def _step(model, optimizer, finish, x, y) -> None:
    from cs336_basics.nn_utils import cross_entropy

    with torch.profiler.record_function("forward"):
        loss = cross_entropy(model(x), y)
    with torch.profiler.record_function("backward"):
        loss.backward()
        finish()
    with torch.profiler.record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad()


def _profile(step, path: Path | None) -> None:
    """One profiled step (the model is warm already); rank 0 writes the Chrome trace (gzipped by torch for a
    ``.gz`` name), to a temporary name first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    if path is not None:
        part = path.with_name(path.name.removesuffix(".json.gz") + ".part.json.gz")
        prof.export_chrome_trace(str(part))
        part.replace(path)


def _run(impl: str, preset: str, batch: int, warmup: int, steps: int, out: Path) -> dict:
    from cs336_basics.presets import get_preset

    config = get_preset(preset)
    device = torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    model, optimizer, finish, timer = _build(impl, config, device)
    x, y = random_batch(config, batch, device)
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if timer is not None:
            timer.log.clear()  # keep the last step's gathers
        start.record()
        _step(model, optimizer, finish, x, y)
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    result = dict(impl=impl, times=[s.elapsed_time(e) for s, e in times[warmup:]],
                  peak=torch.cuda.max_memory_allocated() - base)
    if timer is not None:
        result["gathers"] = timer.slack()
    trace = out / f"fsdp-trace-{impl}.json.gz" if torch.distributed.get_rank() == 0 else None
    step = functools.partial(_step, model, optimizer, finish, x, y)
    _profile(step, trace)
    del step, model, optimizer, finish, timer
    gc.collect()
    torch.cuda.empty_cache()
    return result


def _worker(rank: int, world_size: int, preset: str, batch: int, warmup: int, steps: int, out: Path) -> list:
    results = []
    for impl in IMPLS:
        result = _run(impl, preset, batch, warmup, steps, out)
        if rank == 0:
            print(f"  {impl}: {statistics.median(result['times']):.1f} ms/step, peak "
                  f"{result['peak'] / GIB:.2f} GiB on rank 0", flush=True)
        results.append(result)
    return results


def _tables(preset: str, batch: int, world_size: int, per_rank: list[list[dict]]):
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
    args = parse_run_arguments(__doc__, argv, warmup=3, steps=6, out_help="folder of tables, traces, figures",
                               replot=True)
    title = f"{args.preset}, BF16, {args.world_size} GPUs: one training step, rank 0"
    if args.replot:
        for impl, s in plot_step_timelines(args.out, title).items():
            print(f"{impl}: {s}")
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{args.preset}: ours and FSDP2, {args.warmup}+{args.steps} steps on {args.world_size} GPUs",
          flush=True)
    per_rank = spawn(_worker, args.world_size, args.preset, args.batch_size, args.warmup, args.steps,
                     args.out, backend="nccl", timeout=args.timeout)
    df, gathers = _tables(args.preset, args.batch_size, args.world_size, per_rank)
    summary = gather_summary(gathers)
    write_csv(df, args.out / "fsdp.csv")
    write_csv(gathers, args.out / "fsdp-gathers.csv")
    env = ", ".join(f"{k} {v}" for k, v in environment().items())
    write_text(args.out / "fsdp.md", f"{env}\n\n{markdown_table(df)}\n\n{markdown_table(summary)}\n")
    plot_step_timelines(args.out, title)
    print(markdown_table(summary))
    print(markdown_table(df))
    return df


if __name__ == "__main__":
    main()
