"""Training-step time of the DDP family against torch's DistributedDataParallel, in one run.

    python -m parallel.bench_ddp --preset xl --precisions fp32 bf16 --out docs

Each variant gets a fresh model (a ``cs336_basics`` preset, fp32 weights; ``bf16`` runs the forward and
loss under BF16 autocast), ``torch.optim.AdamW(foreach=True)``, a fixed random batch per rank
(``--batch-size`` sequences of the preset's context per GPU), ``--warmup`` untimed, ``--steps`` timed steps.
Variants: ``local`` (no wrapper, no communication: the floor), ``naive``, ``flat``, ``ddp``, ``bucketed``
(``--bucket-mb``), ``torch`` (DistributedDataParallel with its defaults and the same bucket cap) and
``torch-view`` (the same with ``gradient_as_bucket_view=True``). Gradients are reset by the wrapper's
``zero_grad``: set to None, except ``torch-view``, whose bucket views must persist (zeroed in place), and
``BucketedDDP``'s shared buckets (zeroed in place by its own ``zero_grad``).

CUDA events on each rank time every step: ``step_ms`` (forward, loss, backward, gradient synchronization,
optimizer), ``sync_wait_ms`` (end of backward to end of ``finish_gradient_synchronization`` on the compute
stream: the communication backward did not hide), ``optimizer_ms``. Ranks meet at a barrier before each timed
step; a step lasts as long as its slower rank; the median over timed steps is reported. ``comm_overhead_ms``
= step - local step: what synchronizing gradients costs in all, also for torch, whose waiting happens inside
backward. ``vs_torch`` is the step-time ratio to ``torch``. TFLOP/s per GPU uses
``analysis.accounting.train_step_flops``.

Then BucketedDDP at each ``--sweep-mb`` for ``--sweep-precisions``, and a ``torch.profiler`` trace of one
more step of ``naive`` and ``ddp`` per precision in ``--trace-precisions``, with NVTX / ``record_function``
ranges per phase, drawn (on GPUs) as compute and communication streams against time.

Writes into ``--out``: ``ddp.csv``, ``ddp-sweep.csv``, ``ddp-trace-<variant>-<precision>.json.gz``,
``figures/ddp-overlap-<precision>.png``, ``figures/ddp-bucket-sweep.png``. Falls back to the ``large``
preset only if ``xl`` runs out of memory, and says so. Made for 2+ GPUs (NCCL); ``--backend gloo`` runs
the same code on CPU processes (CPU-only traces, no figure of them, no memory numbers), to check it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from parallel.ddp import DDP, BucketedDDP, FlatDDP, NaiveDDP
from parallel.launch import WorkerError, spawn
from parallel.report import environment, markdown_table, save_figure, write_csv

VARIANTS = ("local", "naive", "flat", "ddp", "bucketed", "torch", "torch-view")
PRECISIONS = ("fp32", "bf16")
TRACED = ("naive", "ddp")


@dataclass(frozen=True)
class Settings:
    preset: str
    batch_size: int
    precisions: tuple[str, ...]
    variants: tuple[str, ...]
    bucket_mb: float
    sweep_mb: tuple[float, ...]
    sweep_precisions: tuple[str, ...]
    trace_precisions: tuple[str, ...]
    warmup: int
    steps: int
    trace_dir: str


@contextlib.contextmanager
def phase(name: str):
    """A named range in torch.profiler traces and, on CUDA, an NVTX range for Nsight Systems users."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.profiler.record_function(name))
        if torch.cuda.is_available():
            stack.enter_context(torch.cuda.nvtx.range(name))
        yield


class _Clock:
    """Marks on the compute stream (CUDA events) or the host clock; ``elapsed_ms(i, j)`` after a sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def elapsed_ms(self, i: int, j: int) -> float:
        if self.cuda:
            return self.marks[i].elapsed_time(self.marks[j])
        return (self.marks[j] - self.marks[i]) * 1e3


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wrap(variant: str, model: torch.nn.Module, bucket_mb: float) -> torch.nn.Module:
    if variant == "local":
        return model
    if variant in ("torch", "torch-view"):
        device_ids = [torch.cuda.current_device()] if dist.get_backend() == "nccl" else None
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=variant == "torch-view",
        )
    if variant == "bucketed":
        return BucketedDDP(model, bucket_size_mb=bucket_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "ddp": DDP}[variant](model)


def _train_step(model, optimizer, inputs, targets, bf16: bool, set_to_none: bool, clock=None) -> None:
    """One step; ``clock`` gets 4 marks: start, end of backward, end of gradient sync, end of optimizer."""
    from cs336_basics.nn_utils import cross_entropy

    mark = clock.mark if clock is not None else lambda: None
    mark()
    with phase("forward"), torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = cross_entropy(model(inputs), targets)
    with phase("backward"):
        loss.backward()
    mark()
    if hasattr(model, "finish_gradient_synchronization"):
        with phase("finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
    mark()
    with phase("optimizer"):
        optimizer.step()
        model.zero_grad(set_to_none=set_to_none)
    mark()


def _run_variant(settings: Settings, variant: str, precision: str, bucket_mb: float, trace_path: str | None):
    """Per-step (step, sync_wait, optimizer) milliseconds on this rank and its peak memory in GiB."""
    from cs336_basics.presets import build_model, get_preset

    config = get_preset(settings.preset)
    rank = dist.get_rank()
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    torch.manual_seed(rank)  # different initial weights per rank: the wrappers must broadcast rank 0's
    model = _wrap(variant, build_model(config, device=device), bucket_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(
        0, config.vocab_size, (settings.batch_size, config.context_length + 1), device=device
    )
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    step_args = (model, optimizer, inputs, targets, precision == "bf16", variant != "torch-view")
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(settings.warmup):
        _train_step(*step_args)
    _synchronize(device)
    dist.barrier()
    times = []
    for _ in range(settings.steps):
        _synchronize(device)
        dist.barrier()  # ranks start each timed step together: drift between them is not timed as waiting
        _synchronize(device)
        clock = _Clock(device)
        _train_step(*step_args, clock=clock)
        _synchronize(device)
        times.append((clock.elapsed_ms(0, 3), clock.elapsed_ms(1, 2), clock.elapsed_ms(2, 3)))
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    if trace_path is not None:
        _trace(step_args, trace_path if rank == 0 else None)
    del model, optimizer, step_args
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return times, peak_gib


def _trace(step_args, path: str | None) -> None:
    """Profile one (already warmed-up) step; rank 0 writes the gzipped Chrome trace to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    device = step_args[2].device
    _synchronize(device)
    dist.barrier()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _train_step(*step_args)
        _synchronize(device)
    if path is not None:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
            partial = Path(path).with_name(Path(path).name + ".part")
            with open(raw, "rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            partial.replace(path)


def _worker(rank: int, world_size: int, settings: Settings, plan: list[tuple[str, str, float, bool]]) -> list:
    results = []
    for variant, precision, bucket_mb, traced in plan:
        trace_path = (
            str(Path(settings.trace_dir) / f"ddp-trace-{variant}-{precision}.json.gz") if traced else None
        )
        times, peak = _run_variant(settings, variant, precision, bucket_mb, trace_path)
        results.append((times, peak))
        if rank == 0:
            median = statistics.median(t[0] for t in times)
            bucket = f" {bucket_mb:g} MiB" if variant in ("bucketed", "torch", "torch-view") else ""
            left = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_initialized() else 0.0
            print(
                f"  {precision} {variant}{bucket}: {median:.1f} ms/step on rank 0, peak {peak:.1f} GiB, "
                f"{left:.2f} GiB still allocated after cleanup",
                flush=True,
            )
    return results


def _plan(settings: Settings) -> list[tuple[str, str, float, bool]]:
    """(variant, precision, bucket MiB, traced) for every measured run, in order."""
    plan = [
        (v, p, settings.bucket_mb, v in TRACED and p in settings.trace_precisions)
        for p in settings.precisions
        for v in settings.variants
    ]
    plan += [
        ("bucketed", p, mb, False)
        for p in settings.sweep_precisions
        for mb in settings.sweep_mb
        if mb != settings.bucket_mb or "bucketed" not in settings.variants or p not in settings.precisions
    ]
    return plan


def _rows(settings: Settings, plan, per_rank) -> pd.DataFrame:
    """One row per run: medians over steps of the slowest rank's times."""
    from analysis.accounting import train_step_flops
    from cs336_basics.presets import get_preset

    config = get_preset(settings.preset)
    flops = train_step_flops(config, settings.batch_size, config.context_length)
    rows = []
    for i, (variant, precision, bucket_mb, _) in enumerate(plan):
        # (ranks, steps, [step, sync_wait, optimizer]) -> the slower rank per step -> median over steps
        slowest = np.array([rank_results[i][0] for rank_results in per_rank]).max(axis=0)
        step_ms, sync_wait_ms, optimizer_ms = np.median(slowest, axis=0)
        rows.append(
            dict(
                preset=settings.preset,
                precision=precision,
                variant=variant,
                bucket_mb=bucket_mb if variant in ("bucketed", "torch", "torch-view") else float("nan"),
                step_ms=step_ms,
                step_min_ms=slowest[:, 0].min(),
                step_max_ms=slowest[:, 0].max(),
                sync_wait_ms=sync_wait_ms,
                optimizer_ms=optimizer_ms,
                peak_mem_GiB=max(rank_results[i][1] for rank_results in per_rank),
                tflops_per_gpu=flops / (step_ms / 1e3) / 1e12,
            )
        )
    df = pd.DataFrame(rows)
    local = df[df["variant"] == "local"].set_index("precision")["step_ms"]
    torch_ref = df[(df["variant"] == "torch")].set_index("precision")["step_ms"]
    df["comm_overhead_ms"] = df["step_ms"] - df["precision"].map(local)
    df["comm_share"] = df["comm_overhead_ms"] / df["step_ms"]
    df["vs_torch"] = df["step_ms"] / df["precision"].map(torch_ref)
    return df


def plot_sweep(sweep: pd.DataFrame, runs: pd.DataFrame, path: Path) -> Path:
    """BucketedDDP step time against bucket size per precision; torch DDP dashed, no communication dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for precision, group in sweep[sweep["variant"] == "bucketed"].groupby("precision"):
        group = group.sort_values("bucket_mb")
        (line,) = ax.plot(group["bucket_mb"], group["step_ms"], marker="o", label=f"BucketedDDP {precision}")
        for variant, style in (("torch", "--"), ("local", ":")):
            ref = runs[(runs["variant"] == variant) & (runs["precision"] == precision)]["step_ms"]
            if len(ref):
                name = "torch DDP" if variant == "torch" else "no communication"
                ax.axhline(ref.iloc[0], color=line.get_color(), linestyle=style, label=f"{name} {precision}")
    ax.set_xscale("log")
    ax.set_xlabel("bucket size (MiB)")
    ax.set_ylabel("step time (ms, median of the slower rank)")
    ax.set_title(f"{runs['preset'].iloc[0]}: BucketedDDP bucket-size sweep", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def run(settings: Settings, world_size: int, backend: str, timeout: float) -> tuple[pd.DataFrame, str]:
    """All runs in one group of workers; falls back to ``large`` if ``xl`` runs out of memory."""
    plan = _plan(settings)
    print(
        f"{len(plan)} runs of {settings.warmup}+{settings.steps} steps, {world_size} {backend} processes",
        flush=True,
    )
    try:
        per_rank = spawn(_worker, world_size, settings, plan, backend=backend, timeout=timeout)
        note = ""
    except WorkerError as err:
        if settings.preset != "xl" or "OutOfMemoryError" not in str(err):
            raise
        note = "xl ran out of memory; these numbers are for the large preset"
        print(note, flush=True)
        settings = Settings(**{**asdict(settings), "preset": "large"})
        per_rank = spawn(_worker, world_size, settings, plan, backend=backend, timeout=timeout)
    return _rows(settings, plan, per_rank), note


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--preset", default="xl", help="cs336_basics preset (xl falls back to large on OOM)")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per GPU")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        help="fp32, and bf16 = BF16 autocast over fp32 weights",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="wrappers to time (local = no communication, the floor)",
    )
    parser.add_argument(
        "--bucket-mb", type=float, default=25.0, help="bucket cap of bucketed and torch (MiB)"
    )
    parser.add_argument(
        "--sweep-mb",
        type=float,
        nargs="*",
        default=[1, 5, 25, 100, 1000],
        help="bucket caps of the BucketedDDP sweep (MiB)",
    )
    parser.add_argument(
        "--sweep-precisions",
        nargs="*",
        choices=PRECISIONS,
        default=["bf16"],
        help="precisions of the bucket sweep",
    )
    parser.add_argument(
        "--trace-precisions",
        nargs="*",
        choices=PRECISIONS,
        default=["fp32", "bf16"],
        help="precisions at which naive and ddp are traced",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--world-size", type=int, default=2, help="processes (one GPU each with NCCL)")
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="nccl on GPUs; gloo runs on CPU processes (a check, no traces); auto: nccl if CUDA",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs"),
        help="folder for ddp.csv, ddp-sweep.csv, traces and figures/",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds before the workers are killed")
    args = parser.parse_args(argv)
    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if args.world_size < 2:
        parser.error(f"--world-size must be >= 2, got {args.world_size}")
    if backend == "nccl" and torch.cuda.device_count() < args.world_size:
        parser.error(
            f"--world-size {args.world_size} needs that many GPUs, found {torch.cuda.device_count()}"
        )
    if args.steps < 1 or args.warmup < 1 or args.batch_size < 1:
        parser.error("--steps, --warmup and --batch-size must be >= 1")
    if args.bucket_mb <= 0 or any(mb <= 0 for mb in args.sweep_mb):
        parser.error("--bucket-mb and --sweep-mb must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        args.preset,
        args.batch_size,
        tuple(args.precisions),
        tuple(args.variants),
        args.bucket_mb,
        tuple(args.sweep_mb),
        tuple(args.sweep_precisions),
        tuple(p for p in args.trace_precisions if p in args.precisions),
        args.warmup,
        args.steps,
        str(args.out),
    )
    df, note = run(settings, args.world_size, backend, args.timeout)
    env = environment()
    for key in ("device", "torch", "date"):
        df[key] = env[key]
    df["note"] = note
    main_runs = df.iloc[: len(settings.precisions) * len(settings.variants)]
    in_sweep = main_runs["variant"].isin(["bucketed", "torch"]) & main_runs["precision"].isin(
        settings.sweep_precisions
    )
    sweep = pd.concat([df.iloc[len(main_runs) :], main_runs[in_sweep]])
    write_csv(main_runs, args.out / "ddp.csv")
    if settings.sweep_mb and settings.sweep_precisions:
        write_csv(sweep, args.out / "ddp-sweep.csv")
        plot_sweep(sweep, main_runs, args.out / "figures" / "ddp-bucket-sweep.png")
    from parallel.trace_plot import plot_timelines

    for precision in settings.trace_precisions if backend == "nccl" else ():
        traces = {
            v: args.out / f"ddp-trace-{v}-{precision}.json.gz" for v in TRACED if v in settings.variants
        }
        if traces:
            summaries = plot_timelines(
                traces,
                args.out / "figures" / f"ddp-overlap-{precision}.png",
                title=f"{df['preset'].iloc[0]}, {precision}, one training step, rank 0",
            )
            for variant, s in summaries.items():
                print(f"trace {variant} {precision}: " + ", ".join(f"{k} {v:.3g}" for k, v in s.items()))
    columns = [
        "precision",
        "variant",
        "bucket_mb",
        "step_ms",
        "sync_wait_ms",
        "comm_overhead_ms",
        "comm_share",
        "vs_torch",
        "tflops_per_gpu",
        "peak_mem_GiB",
    ]
    print(
        f"\n{df['preset'].iloc[0]} on {env['device']}, torch {env['torch']}, "
        f"batch {args.batch_size} per GPU. {note}"
    )
    print(markdown_table(main_runs[columns]))
    if len(sweep):
        print(markdown_table(sweep[columns]))
    return df


if __name__ == "__main__":
    main()
