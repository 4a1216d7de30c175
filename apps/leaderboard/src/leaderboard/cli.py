"""``train.py``: time training steps of a named recipe, check them, run the ablation, or train on a token
file.

The path of a run, each step once: parse the options (this module, before torch is imported) -> plan the
job (``job.plan_job``: the recipe resolved and validated once, every file checked) -> start the ranks
(``launching.launch``) -> each rank runs the job's mode (``modes.run_job``) over a trainer built in one
order (``build.build_trainer``: model -> ``parallelize`` -> optimizer -> ``Trainer``) -> rank 0's result is
reported (``report.report``). Every argument and recipe error is raised before any process starts, and so
is a ``--save`` folder that cannot be written or that another run holds (its lock, ``save_lock``).

Modes: the benchmark (default), ``--check``, ``--ablation``, ``--data`` (training); ``MODE_OPTIONS`` says
which options belong to which modes.

Where the ranks run:
- under ``torchrun`` (RANK, WORLD_SIZE, MASTER_ADDR set; any number of nodes): this process is one rank;
- more than one rank on GPUs: ``parallel.launch.torchrun`` (torch.distributed.run's launcher), one
  process per GPU (``--ranks`` to change), ``leaderboard-8b`` by default;
- more than one rank on a CPU: ``parallel.launch.spawn`` (gloo, 2 ranks and ``tiny`` by default);
- one rank: this process, in a one-rank group, so the sharded code path is the same (on one GPU the largest
  recipe whose sharded training state fits it).

The benchmark prints the resolved recipe, one line per step (time, tokens/s, TFLOP/s and MFU per GPU, peak
memory), the start-up and first-step (compile) times, and a last line ``median step time: X s``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from harness.cli import non_negative_int, positive_float, positive_int

from .recipe import FIELDS
from .recipes import RECIPES

MODE_FLAGS = {"check": "--check", "ablation": "--ablation", "train": "--data"}  # the benchmark has none
# options that belong to some modes only -> those modes
MODE_OPTIONS = {
    "baseline": ("bench", "train"),
    "time_budget": ("ablation", "train"),
    "row_steps": ("ablation",),
    **{name: ("train",) for name in ("valid", "save", "resume", "force", "out")},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Time full training steps (forward, loss, backward, AdamW) of a named recipe, sharded "
        "over every rank; --baseline times the torch-native step instead, --check verifies the optimized "
        "step against the reference model, --ablation times the step one optimization at a time, --data "
        "trains on a token file.",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(RECIPES),
        default=None,
        help="recipe to run: leaderboard-8b (8B model, context 32768, batch 2), large-8k (large at "
        "context 8192, batch 2), tiny (CPU-sized), proxy-8b (one GPU standing for one rank of "
        "leaderboard-8b on 2 GPUs: 17 of its 34 blocks, one sequence, the rank's memory held back; "
        "a proxy, not the 8B step). Default: leaderboard-8b with >= 2 GPUs, "
        "the largest that fits on one GPU, tiny on a CPU.",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="measured (or trained) steps: training.steps (default: the recipe's)",
    )
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help="warm-up steps excluded from the median, benchmark.warmup (default: the recipe's; the first one "
        "includes compilation and autotuning)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one recipe field, e.g. --set activation_checkpoint.blocks=8 "
        "--set model.attention=cudnn; "
        "a field's plain name works too (--set checkpoint_blocks=8). Fields: " + ", ".join(FIELDS),
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="time (or train) the torch-native step (FSDP2, SDPA, per-block checkpointing, "
        "fused torch AdamW)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="instead of timing, compare loss, gradients and updated weights after one step of the "
        "optimized step with the reference model + cs336_basics AdamW (fp32 and bf16); a reference that "
        "would not fit the GPU's free memory is checked at a shorter context or with fewer blocks",
    )
    mode.add_argument(
        "--ablation",
        nargs="?",
        const="full",
        choices=("full", "ends"),
        default=None,
        help="in one launch, time the baseline, then the optimized step adding one optimization per row "
        "('full', the default), or only the baseline and the fully optimized step ('ends'); then the "
        "alternatives (the full step planned with 8 GiB more and less memory headroom); prints a table "
        "and writes it as CSV and Markdown beside --json",
    )
    mode.add_argument("--data", type=Path, default=None, metavar="TOKENS",
                      help="train on this token file (flat uint16 token ids, e.g. from "
                      "python -m leaderboard.tokens)")  # fmt: skip
    parser.add_argument(
        "--time-budget",
        type=positive_float,
        default=None,
        metavar="S",
        help="with --ablation: start no further row once S seconds since launch plus the shortest row "
        "so far would be exceeded (the rows left out are listed as skipped); with --data: start no "
        "further step once S seconds since launch have passed (then evaluate, save and report)",
    )
    parser.add_argument(
        "--row-steps",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --ablation: measured steps of the rows between the baseline and the fully optimized "
        "step and of the alternatives (default: --steps)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the resolved recipe, every step and the summary to this JSON file",
    )
    training = parser.add_argument_group("training on a token file (with --data)")
    training.add_argument(
        "--valid",
        type=Path,
        default=None,
        metavar="TOKENS",
        help="held-out file for the evaluation loss (every training.eval_every steps; default: none)",
    )
    training.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="DIR",
        help="write sharded checkpoints DIR/step-NNNNNN (every checkpoint.save_every steps and after the "
        "last)",
    )
    training.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --save DIR (refused if a field that shapes the model, "
        "the data or the optimizer state differs from the checkpoint's recipe)",
    )
    training.add_argument(
        "--force",
        action="store_true",
        help="take over the lock of --save DIR left by a run on another host (a run on this host that is "
        "gone is taken over without it)",
    )
    training.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where losses.csv and loss.png go (default: results/train-<recipe>)",
    )
    parser.add_argument(
        "--ranks",
        type=positive_int,
        default=None,
        help="processes on this node (default: one per GPU; 2 on a CPU)",
    )
    parser.add_argument(
        "--stall-timeout",
        "--timeout",
        dest="stall_timeout",
        type=positive_float,
        default=600.0,
        metavar="S",
        help="stop the run once no rank has reported progress (a heartbeat at start-up, compile, every "
        "step, evaluation and save) for S seconds (at least 120 s until every rank has started), naming "
        "the ranks and their last phase; a healthy run of any length is never stopped (default: 600)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with ``mode`` ("bench", "check", "ablation" or "train"); exits with a usage error naming
    an option given to a mode it does not belong to."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.mode = next((mode for mode, flag in MODE_FLAGS.items() if getattr(args, flag[2:])), "bench")
    for name, modes in MODE_OPTIONS.items():
        if getattr(args, name) in (None, False) or args.mode in modes:
            continue
        option = "--" + name.replace("_", "-")
        if "bench" in modes:
            parser.error(f"{option} cannot be combined with {MODE_FLAGS[args.mode]}")
        parser.error(f"{option} needs {' or '.join(MODE_FLAGS[m] for m in modes)}")
    return args


def main(argv: list[str] | None = None) -> int:
    launch_time = time.time()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts
    from parallel.launch import WorkerError

    from .job import locked_save, plan_job
    from .launching import launch
    from .report import report
    from .train_state import ResumeMismatch

    with contextlib.ExitStack() as stack:
        try:  # a recipe field, file or folder that cannot work: nothing was launched
            stack.enter_context(locked_save(args, argv))
            job = plan_job(args, argv, launch_time)
        except ValueError as error:
            print(f"train.py: error: {error}", file=sys.stderr)
            return 2
        try:
            result = launch(job)
        except (WorkerError, TimeoutError, ResumeMismatch) as error:  # a rank failed, the run stalled
            print(f"train.py: error: {error}", file=sys.stderr)
            return 1
        if result is None:  # a rank other than 0 under torchrun
            return 0
        return report(result, job)


if __name__ == "__main__":
    sys.exit(main())
