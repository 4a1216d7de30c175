"""``train.py``: time training steps of a named recipe, check them, or train on a token file.

The path of a run: parse (this module, before torch is imported) -> plan the job (``job.plan_job``: the
recipe with its overrides, every check of recipe and files) -> start the ranks (``launching.launch``) ->
each rank builds its trainer and runs its steps (``job.run_job``) -> rank 0's result is reported
(``report.report``). Every argument and recipe error is raised before any process starts, and so is a
``--save`` folder that cannot be written or that another run holds (its lock, ``save_lock``).

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
import dataclasses
import os
import sys
import time
from pathlib import Path

from .recipes import RECIPES, Recipe


def _at_least(low: int):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return convert


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    fields = ", ".join(f.name for f in dataclasses.fields(Recipe) if f.name != "name")
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Time full training steps (forward, loss, backward, AdamW) of a named recipe, sharded "
        "over every rank; --baseline times the torch-native step instead, --check verifies the optimized "
        "step against the reference model, --data trains on a token file.",
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
        "--steps", type=_at_least(1), default=None, help="measured (or trained) steps (default: the recipe's)"
    )
    parser.add_argument(
        "--warmup",
        type=_at_least(0),
        default=None,
        help="warm-up steps excluded from the median (default: the recipe's; the first one "
        "includes compilation and autotuning)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override one recipe field, e.g. --set checkpoint_blocks=8 --set attention=cudnn "
        f"(fields: {fields})",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="time (or train) the torch-native step (FSDP2, SDPA, per-block checkpointing, "
        "fused torch AdamW)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="instead of timing, compare loss, gradients and updated weights after one step of the "
        "optimized step with the reference model + cs336_basics AdamW (fp32 and bf16)",
    )
    parser.add_argument(
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
    parser.add_argument(
        "--time-budget",
        type=_positive_float,
        default=None,
        metavar="S",
        help="with --ablation: start no further row once S seconds since launch plus the shortest row "
        "so far would be exceeded (the rows left out are listed as skipped); with --data: start no "
        "further step once S seconds since launch have passed (then evaluate, save and report)",
    )
    parser.add_argument(
        "--row-steps",
        type=_at_least(1),
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
    training = parser.add_argument_group(
        "training on a token file (flat uint16 token ids, e.g. from python -m leaderboard.tokens)"
    )
    training.add_argument("--data", type=Path, default=None, metavar="TOKENS", help="train on this file")
    training.add_argument(
        "--valid",
        type=Path,
        default=None,
        metavar="TOKENS",
        help="held-out file for the evaluation loss (every eval_every steps; default: none)",
    )
    training.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="DIR",
        help="write sharded checkpoints DIR/step-NNNNNN (every save_every steps and after the last)",
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
        type=_at_least(1),
        default=None,
        help="processes on this node (default: one per GPU; 2 on a CPU)",
    )
    parser.add_argument(
        "--stall-timeout",
        "--timeout",
        dest="stall_timeout",
        type=_positive_float,
        default=600.0,
        metavar="S",
        help="stop the run once no rank has reported progress (a heartbeat at start-up, compile, every "
        "step, evaluation and save) for S seconds, naming the ranks and their last phase; a healthy run "
        "of any length is never stopped (default: 600)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the options that belong together; exits with a usage error naming the option."""
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [name for name in ("check", "ablation", "data") if getattr(args, name)]
    if len(modes) > 1:
        parser.error(f"--{modes[0]} and --{modes[1]} cannot be combined")
    if args.time_budget is not None and not (args.ablation or args.data):
        parser.error("--time-budget needs --ablation or --data")
    if args.row_steps is not None and not args.ablation:
        parser.error("--row-steps needs --ablation")
    if args.check and args.baseline:
        parser.error("--check compares both trainers already; drop --baseline")
    if args.ablation and args.baseline:
        parser.error("--ablation times the baseline already; drop --baseline")
    if args.baseline and args.save is not None:
        parser.error("--save writes parallel.checkpoint shards, which the --baseline trainer (torch FSDP2) "
                     "does not have; drop --baseline or --save")  # fmt: skip
    training_only = [f"--{n}" for n in ("valid", "save", "out") if getattr(args, n) is not None]
    training_only += [f"--{n}" for n in ("resume", "force") if getattr(args, n)]
    if training_only and not args.data:
        parser.error(f"{', '.join(training_only)} need --data")
    if args.resume and args.save is None:
        parser.error("--resume needs --save DIR (the folder of the checkpoints)")
    return args


def main(argv: list[str] | None = None) -> int:
    launch_time = time.time()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts
    from parallel.launch import WorkerError

    from .job import locked_save, plan_job
    from .launching import launch
    from .recipes import ResumeMismatch
    from .report import report

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
