"""Training-step time of the DDP family against torch's DistributedDataParallel, in one run.

    python -m parallel_bench.ddp --preset xl --precisions fp32 bf16 --out docs

Variants: ``local`` (no wrapper, no communication: the floor), ``naive``, ``flat``, ``ddp``, ``bucketed``
(``--bucket-mb``), ``torch`` (DistributedDataParallel with its defaults and the same bucket cap) and
``torch-view`` (the same with ``gradient_as_bucket_view=True``); each trains ``--batch-size`` sequences of
the preset's context per GPU for ``--warmup`` untimed and ``--steps`` timed steps
(``parallel_bench.ddp_steps``). Reported: ``step_ms`` (forward, loss, backward, gradient synchronization,
optimizer), ``sync_wait_ms`` (end of backward to end of ``finish_gradient_synchronization`` on the compute
stream: the communication backward did not hide), ``optimizer_ms``, each the median over timed steps of
the slower rank; ``comm_overhead_ms`` = step - local step (also for torch, whose waiting happens inside
backward); ``vs_torch``, the step-time ratio to ``torch``; TFLOP/s per GPU from
``analysis.accounting.train_step_flops``.

Then BucketedDDP at each ``--sweep-mb`` for ``--sweep-precisions``, and a ``torch.profiler`` trace of one
more step of ``naive`` and ``ddp`` per precision in ``--trace-precisions``, with NVTX / ``record_function``
ranges per phase, drawn (on GPUs) as compute and communication streams against time.

Writes into ``--out`` (default ``results``; docs/ only when told): ``ddp.csv``, ``ddp-sweep.csv``,
``ddp-trace-<variant>-<precision>.json.gz``, ``figures/ddp-overlap-<precision>.png``,
``figures/ddp-bucket-sweep.png``. Falls back to the ``large`` preset only if ``xl`` runs out of memory,
and says so. Made for 2+ GPUs (NCCL); ``--backend gloo`` runs the same code on CPU processes (CPU-only
traces, no figure of them, no memory numbers), to check it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness import cli

VARIANTS = ("local", "naive", "flat", "ddp", "bucketed", "torch", "torch-view")
PRECISIONS = ("fp32", "bf16")
COLUMNS = [
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


@dataclass(frozen=True)
class DDPConfig:
    """One run of the benchmark: what to train, which wrappers and bucket sizes, how many processes."""

    preset: str = "xl"
    batch_size: int = 4
    precisions: tuple[str, ...] = PRECISIONS
    variants: tuple[str, ...] = VARIANTS
    bucket_mb: float = 25.0
    sweep_mb: tuple[float, ...] = (1, 5, 25, 100, 1000)
    sweep_precisions: tuple[str, ...] = ("bf16",)
    trace_precisions: tuple[str, ...] = PRECISIONS
    warmup: int = 3
    steps: int = 5
    world_size: int = 2
    backend: str = "gloo"
    out: str = "results"
    timeout: float = 1200

    def plan(self) -> list[tuple[str, str, float, bool]]:
        """(variant, precision, bucket MiB, traced) for every measured run, in order: the main runs, then
        the sweep cells the main runs do not already hold."""
        from parallel_bench.ddp_steps import TRACED

        plan = [
            (v, p, self.bucket_mb, v in TRACED and p in self.trace_precisions)
            for p in self.precisions
            for v in self.variants
        ]
        plan += [
            ("bucketed", p, mb, False)
            for p in self.sweep_precisions
            for mb in self.sweep_mb
            if mb != self.bucket_mb or "bucketed" not in self.variants or p not in self.precisions
        ]
        return plan


def measure(config: DDPConfig):
    """Every run of ``config.plan()`` in one group of workers (falling back to ``large`` if ``xl`` runs out
    of memory); the table, with the environment and a note on any fallback."""
    from harness.environment import environment
    from parallel.launch import WorkerError, spawn

    from parallel_bench.ddp_steps import table, worker

    plan = config.plan()
    print(
        f"{len(plan)} runs of {config.warmup}+{config.steps} steps, {config.world_size} {config.backend} "
        f"processes",
        flush=True,
    )
    run = lambda c: spawn(worker, c.world_size, c, plan, backend=c.backend, timeout=c.timeout)
    try:
        per_rank, note = run(config), ""
    except WorkerError as err:
        if config.preset != "xl" or "OutOfMemoryError" not in str(err):
            raise
        note = "xl ran out of memory; these numbers are for the large preset"
        print(note, flush=True)
        config = replace(config, preset="large")
        per_rank = run(config)
    df = table(config.preset, config.batch_size, plan, per_rank)
    env = environment()
    for key in ("device", "torch", "date"):
        df[key] = env[key]
    df["note"] = note
    return df


def report(df, config: DDPConfig) -> None:
    """Write the tables and figures under ``config.out`` and print the tables."""
    import pandas as pd
    from harness.results import to_markdown, write_table

    from parallel_bench.ddp_steps import TRACED
    from parallel_bench.trace_plot import plot_bucket_sweep, plot_timelines

    out = Path(config.out)
    main_runs = df.iloc[: len(config.precisions) * len(config.variants)]
    in_sweep = main_runs["variant"].isin(["bucketed", "torch"]) & main_runs["precision"].isin(
        config.sweep_precisions
    )
    sweep = pd.concat([df.iloc[len(main_runs) :], main_runs[in_sweep]])
    write_table(main_runs, out / "ddp", formats=("csv",))
    if config.sweep_mb and config.sweep_precisions:
        write_table(sweep, out / "ddp-sweep", formats=("csv",))
        plot_bucket_sweep(sweep, main_runs, out / "figures" / "ddp-bucket-sweep.png")
    for precision in config.trace_precisions if config.backend == "nccl" else ():
        traces = {v: out / f"ddp-trace-{v}-{precision}.json.gz" for v in TRACED if v in config.variants}
        if traces:
            title = f"{df['preset'].iloc[0]}, {precision}, one training step, rank 0"
            summaries = plot_timelines(traces, out / "figures" / f"ddp-overlap-{precision}.png", title=title)
            for variant, s in summaries.items():
                print(f"trace {variant} {precision}: " + ", ".join(f"{k} {v:.3g}" for k, v in s.items()))
    print(
        f"\n{df['preset'].iloc[0]} on {df['device'].iloc[0]}, torch {df['torch'].iloc[0]}, "
        f"batch {config.batch_size} per GPU. {df['note'].iloc[0]}"
    )
    print(to_markdown(main_runs[COLUMNS], ".3g"))
    if len(sweep):
        print(to_markdown(sweep[COLUMNS], ".3g"))


def parse_args(argv: list[str] | None = None) -> DDPConfig:
    p = cli.command_parser("python -m parallel_bench.ddp", __doc__)
    p.add_argument("--preset", default="xl", help="cs336_basics preset (xl falls back to large on OOM)")
    p.add_argument("--batch-size", type=cli.positive_int, default=4, help="sequences per GPU")
    cli.add_list(
        p,
        "--precisions",
        str,
        PRECISIONS,
        "fp32, and bf16 = BF16 autocast over fp32 weights",
        choices=PRECISIONS,
    )
    cli.add_list(
        p,
        "--variants",
        str,
        VARIANTS,
        "wrappers to time (local = no communication, the floor)",
        choices=VARIANTS,
    )
    p.add_argument(
        "--bucket-mb", type=cli.positive_float, default=25.0, help="bucket cap of bucketed and torch (MiB)"
    )
    p.add_argument(
        "--sweep-mb",
        type=cli.positive_float,
        nargs="*",
        default=[1, 5, 25, 100, 1000],
        help="bucket caps of the BucketedDDP sweep (MiB); none: no sweep",
    )
    for flag, default, what in (
        ("--sweep-precisions", ["bf16"], "precisions of the bucket sweep"),
        ("--trace-precisions", list(PRECISIONS), "precisions at which naive and ddp are traced"),
    ):
        p.add_argument(flag, nargs="*", choices=PRECISIONS, default=default, help=what)
    cli.add_steps(p, steps=5, warmup=3)
    p.add_argument(
        "--world-size", type=cli.positive_int, default=2, help="processes (one GPU each with NCCL)"
    )
    cli.add_out(p, "results", "folder for ddp.csv, ddp-sweep.csv, traces and figures/")
    cli.add_launch(p, timeout=1200)
    args = p.parse_args(argv)
    if args.world_size < 2:
        p.error(f"--world-size must be >= 2, got {args.world_size}")
    if args.warmup < 1:
        p.error(f"--warmup must be >= 1, got {args.warmup}")
    try:
        backend = cli.resolve_backend(args.backend, args.world_size)
    except ValueError as err:
        p.error(f"--world-size: {err}")
    return DDPConfig(
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
        args.world_size,
        backend,
        args.out,
        args.timeout,
    )


def main(argv: list[str] | None = None):
    config = parse_args(argv)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    df = measure(config)
    report(df, config)
    return df


if __name__ == "__main__":
    main()
