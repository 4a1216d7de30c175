"""Every GPU measurement behind ``docs/profiling.md``, in one process, bounded by a time budget.

``python -m profiling.experiments --out results --budget-s 240`` runs, in this order (the warm-up study
must come first, while the process is still cold):

1. warm-up study: small, full step, fp32 then bf16, 15 steps with no warm-up (any window of 10 steps
   starting at 0, 1, 2 or 5 is the measurement with that many warm-up steps);
2. mixed-precision report (``profiling.precision``); saved-for-backward of one xl block (ctx 512);
3. cost of the NVTX ranges and of the per-step synchronization (small, ctx 512, full step, fp32 and
   bf16; ``--overhead-rounds`` alternating rounds of 10 steps each way);
4. the main table: every size x (forward, forward-backward, train) x (fp32, bf16), ctx 512, eager;
   5 warm-up + 10 measured steps for small / medium / large, fewer for xl and 10B (``--big-steps``);
5. memory timelines of xl at ctx 128 and 2048, forward and full step, fp32 and bf16;
6. kernel tables of small and medium at three contexts, forward and full step, fp32;
7. activation checkpointing of xl, batch 4, ctx 2048: peak memory of forward+backward per strategy;
8. ``torch.compile`` of small and medium (forward and full step, bf16 then fp32; 3 warm-up steps, which
   absorb the compilation, and 10 measured), while the budget lasts; compare with part 4.

Each part writes its tables under ``--out`` as it finishes (``profiling.experiment_parts``), and the
folder is packed into ``<out>.tar.gz`` (or ``--pack``) after every part, so a run stopped by a time limit
still returns what it measured. Parts that would start after the budget are skipped; ``parts.json`` says
what ran, failed or was skipped, with the run's device, versions, date and command. ``--dry-run`` runs
the same script with every size replaced by the ``tiny`` preset and every context divided by 16 (a
check of the script itself on a CPU; memory timelines need CUDA and fail there).
"""

from __future__ import annotations

import timeit
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness import cli

PARTS = (
    "warmup",
    "precision-saved",
    "overheads",
    "bench-eager",
    "memory",
    "kernels",
    "checkpoint",
    "compile",
)


@dataclass(frozen=True)
class ExperimentsConfig:
    out: str = "results"
    pack: str | None = None  # default <out>.tar.gz
    budget_s: float = 240
    reserve_s: float = 100  # budget kept for the parts after the main table
    big_steps: tuple[int, int] = (2, 5)  # warm-up, measured steps for xl
    huge_steps: tuple[int, int] = (1, 3)  # for 10B
    overhead_rounds: int = 40
    device: str = "cuda"
    only: tuple[str, ...] = PARTS
    dry_run: bool = False


def measure(config: ExperimentsConfig) -> dict:
    """Run the chosen parts within the budget; the log written to ``parts.json`` after every part."""
    from harness.environment import environment
    from harness.results import write_json

    from . import experiment_parts as parts
    from .workload import free_device_memory

    run = parts.Run(Path(config.out), config.device, config.dry_run)
    run.out.mkdir(parents=True, exist_ok=True)
    start = timeit.default_timer()

    def left() -> float:
        return config.budget_s - (timeit.default_timer() - start)

    steps = {
        "warmup": lambda: parts.warmup_study(run),
        "precision-saved": lambda: parts.precision_and_saved(run),
        "overheads": lambda: parts.overheads(run, config.overhead_rounds),
        "bench-eager": lambda: parts.main_table(
            run, config.big_steps, config.huge_steps, max(left() - config.reserve_s, 30)
        ),
        "memory": lambda: parts.memory_timelines(run),
        "kernels": lambda: parts.kernel_tables(run),
        "checkpoint": lambda: parts.checkpoint_peaks(run),
        "compile": lambda: parts.compiled_table(run, left() - 45),
    }
    log = {**environment(), "parts": {}}
    archive = Path(config.pack) if config.pack else run.out.with_name(run.out.name + ".tar.gz")
    for name in (p for p in PARTS if p in config.only):
        if left() <= 0:
            log["parts"][name] = "skipped (time budget)"
            continue
        t0 = timeit.default_timer()
        print(f"== {name} ({left():.0f} s of budget left)", flush=True)
        try:
            steps[name]()
            log["parts"][name] = f"ok in {timeit.default_timer() - t0:.1f} s"
        except Exception:
            traceback.print_exc()
            log["parts"][name] = "failed: " + traceback.format_exc(limit=3).splitlines()[-1]
        free_device_memory()
        write_json(run.out / "parts.json", log)
        parts.pack(run.out, archive)
    return log


def parse_args(argv: list[str] | None = None) -> ExperimentsConfig:
    p = cli.command_parser("python -m profiling.experiments", __doc__)
    cli.add_out(p, "results", "output folder; also packed as <out>.tar.gz")
    p.add_argument("--pack", help="path of the .tar.gz written after each part (default <out>.tar.gz)")
    p.add_argument("--budget-s", type=cli.positive_float, default=240,
                   help="start no part after this many seconds")  # fmt: skip
    p.add_argument("--reserve-s", type=cli.non_negative_float, default=100,
                   help="budget kept for the parts after the main table")  # fmt: skip
    for flag, default, size in (("--big-steps", (2, 5), "xl"), ("--huge-steps", (1, 3), "10B")):
        p.add_argument(
            flag,
            type=cli.non_negative_int,
            nargs=2,
            default=default,
            metavar=("WARMUP", "STEPS"),
            help=f"warm-up and measured steps for {size}",
        )
    p.add_argument(
        "--overhead-rounds",
        type=cli.positive_int,
        default=40,
        help="alternating rounds of 10 steps for each overhead measurement",
    )
    cli.add_device(p, default="cuda")
    cli.add_list(p, "--only", str, PARTS, "parts to run", choices=PARTS)
    p.add_argument(
        "--dry-run", action="store_true", help="tiny preset, contexts / 16: check the script on a CPU"
    )
    args = p.parse_args(argv)
    if min(args.big_steps[1], args.huge_steps[1]) < 1:
        p.error("--big-steps and --huge-steps need at least 1 measured step")
    return ExperimentsConfig(
        args.out,
        args.pack,
        args.budget_s,
        args.reserve_s,
        tuple(args.big_steps),
        tuple(args.huge_steps),
        args.overhead_rounds,
        args.device,
        tuple(args.only),
        args.dry_run,
    )


def main(argv: list[str] | None = None) -> None:
    import json

    print(json.dumps(measure(parse_args(argv)), indent=1))


if __name__ == "__main__":
    main()
