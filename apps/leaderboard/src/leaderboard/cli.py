"""Training-step benchmark: ``uv run apps/leaderboard/train.py`` or ``python -m leaderboard.cli``.

Where it runs:
- under ``torchrun`` (RANK, WORLD_SIZE, MASTER_ADDR set): this process is one rank, on any number of nodes;
- with 2 or more GPUs and no torchrun: it relaunches itself through ``torch.distributed.run`` with one
  process per GPU (``--ranks`` to change) and runs ``leaderboard-8b``; the command line reaches the
  ranks through the environment, so torchrun never parses it;
- with one GPU: one process, the largest recipe whose sharded training state fits the GPU;
- on a CPU-only machine: ``tiny`` on 2 gloo processes (``parallel.launch.spawn``).

It prints the resolved recipe, one line per step (time, tokens/s, TFLOP/s and MFU per GPU, peak
memory), the start-up and first-step (compile) times, and a last line ``median step time: X s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .recipes import RECIPES, Recipe, get_recipe

LAUNCH_TIME_ENV = "LEADERBOARD_LAUNCH_TIME"
ARGV_ENV = "LEADERBOARD_ARGV"  # the relaunching process's arguments, as JSON, for the ranks it starts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Time full training steps (forward, loss, backward, AdamW) of a named recipe, sharded "
        "over "
        "every rank; --baseline times the torch-native step instead, --check verifies the optimized "
        "step against the reference model.",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(RECIPES),
        default=None,
        help="recipe to run: leaderboard-8b (8B model, context 32768, batch 2), large-8k (large at "
        "context 8192, batch 2), tiny (CPU-sized). Default: leaderboard-8b with >= 2 GPUs, "
        "the largest that fits on one GPU, tiny on a CPU.",
    )
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default: the recipe's)")
    parser.add_argument(
        "--warmup",
        type=int,
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
        f"(fields: {', '.join(f.name for f in dataclasses.fields(Recipe) if f.name != 'name')})",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="time the torch-native step (FSDP2, SDPA, per-block checkpointing, fused torch AdamW)",
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
        type=float,
        default=None,
        metavar="S",
        help="with --ablation: start no further row once S seconds since launch plus the shortest row "
        "so far would be exceeded (the rows left out are listed as skipped)",
    )
    parser.add_argument(
        "--row-steps",
        type=int,
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
    parser.add_argument(
        "--ranks", type=int, default=None, help="processes on this node (default: one per GPU; 2 on a CPU)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds before CPU worker processes are killed instead of hanging",
    )
    return parser.parse_args(argv)


def _convert(field: dataclasses.Field, text: str):
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    if kind == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set {field.name} expects true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def resolve_recipe(args: argparse.Namespace, gpus: int, gpu_memory_bytes: int) -> Recipe:
    """The named recipe (or the device's default) with the command line's overrides applied."""
    recipe = get_recipe(args.preset or default_recipe_name(gpus, gpu_memory_bytes))
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    changes = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in fields or key == "name":
            raise ValueError(
                f"--set expects FIELD=VALUE with FIELD one of {sorted(set(fields) - {'name'})}, got {item!r}"
            )
        changes[key] = _convert(fields[key], value)
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    return recipe.with_(**changes)


def default_recipe_name(gpus: int, gpu_memory_bytes: int) -> str:
    """leaderboard-8b on >= 2 GPUs; on one GPU the largest recipe whose fp32 params, grads and AdamW
    moments (16 bytes per parameter) leave 20 GiB for activations; tiny on a CPU."""
    if gpus == 0:
        return "tiny"
    if gpus >= 2:
        return "leaderboard-8b"
    for name in ("leaderboard-8b", "large-8k"):
        if 16 * RECIPES[name].model_config().parameter_count + 20 * 2**30 < gpu_memory_bytes:
            return name
    return "tiny"


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(path)


def environment(argv: list[str]) -> dict:
    import triton

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": " ".join(["train.py", *argv]),
    }


def rank_main(
    rank: int,
    world_size: int,
    device: torch.device,
    args: argparse.Namespace,
    recipe: Recipe,
    launch_time: float,
) -> dict:
    """What every rank runs once its process group is up."""
    if args.check:
        from .check import run_check

        return run_check(rank, world_size, device, recipe)
    from .worker import run_ablation, run_benchmark

    if args.ablation:

        def save_partial(runs: list[dict]) -> None:
            if args.json is not None:
                write_json(args.json, {"partial": True, "resolved_recipe": recipe.as_dict(), "runs": runs})

        return run_ablation(
            rank,
            world_size,
            device,
            recipe,
            launch_time,
            args.ablation,
            args.time_budget,
            row_steps=args.row_steps,
            on_row=save_partial,
        )
    return run_benchmark(rank, world_size, device, recipe, args.baseline, launch_time)


def _spawned(rank: int, world_size: int, args, recipe, launch_time) -> dict:
    return rank_main(rank, world_size, torch.device("cpu"), args, recipe, launch_time)


def report(result: dict, args: argparse.Namespace, recipe: Recipe, argv: list[str]) -> None:
    """Rank 0's closing lines and the JSON file."""
    payload = {"environment": environment(argv), "resolved_recipe": recipe.as_dict(), "result": result}
    if args.json is not None:
        write_json(args.json, payload)
        print(f"wrote {args.json}")
    if args.check:
        print(result["table"])
        print("check passed" if result["passed"] else "check FAILED")
        return
    if args.ablation:
        table = ablation_table(result["runs"])
        if args.json is not None:
            table.to_csv(args.json.with_suffix(".csv"), index=False)
            args.json.with_suffix(".md").write_text(table.to_markdown(index=False, floatfmt=".3f") + "\n")
        print(table.to_markdown(index=False, floatfmt=".3f"))
        result = result["runs"][result["headline"]]
        if "error" in result:
            return
        print(
            f"last row: set-up {result['setup_seconds']:.1f} s, "
            f"first step {result['first_step_seconds']:.1f} s"
        )
    else:
        startup = result["launch_to_first_step_end_seconds"] - result["first_step_seconds"]
        print(
            f"start-up (launch to trainer built): {startup:.1f} s;"
            f" first step (compile, autotune): {result['first_step_seconds']:.1f} s;"
            f" launch to last step: {result['launch_to_end_seconds']:.1f} s"
        )
    if result["peak_memory_gib_per_gpu"] is not None:
        print(
            f"peak memory: {result['peak_memory_gib_per_gpu']:.1f} GiB per GPU; median MFU "
            f"{100 * result['median_mfu']:.1f}%, {result['median_tflops_per_gpu']:.0f} TFLOP/s per GPU"
        )
    print(f"median step time: {result['median_step_seconds']:.4f} s")


def ablation_table(runs: list[dict]):
    """One row per ablation step: median step time, its ratio to the baseline, MFU, memory."""
    import pandas as pd

    base = runs[0].get("median_step_seconds")
    rows = []
    for run in runs:
        seconds = run.get("median_step_seconds")
        rows.append(
            {
                "step": run["label"],
                "median s": seconds,
                "x baseline": seconds / base if seconds and base else None,
                "TFLOP/s/GPU": run.get("median_tflops_per_gpu"),
                "MFU %": 100 * run["median_mfu"] if run.get("median_mfu") is not None else None,
                "peak GiB/GPU": run.get("peak_memory_gib_per_gpu"),
                "alloc retries": run.get("allocator_retries"),
                "first-step loss": run["steps"][0]["loss"] if run.get("steps") else None,
                "note": run.get("error", ""),
            }
        )
    return pd.DataFrame(rows)


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _torchrun_command(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "leaderboard.cli",
    ]


def main(argv: list[str] | None = None) -> int:
    launch_time = float(os.environ.get(LAUNCH_TIME_ENV, time.time()))
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts
    if argv is None:
        argv = json.loads(os.environ[ARGV_ENV]) if ARGV_ENV in os.environ else sys.argv[1:]
    args = parse_args(argv)
    nproc = args.ranks or (torch.cuda.device_count() or 2)
    if nproc < 1:
        raise ValueError(f"--ranks must be >= 1, got {nproc}")
    gpus = min(torch.cuda.device_count(), nproc)  # the GPUs this run uses
    memory = torch.cuda.get_device_properties(0).total_memory if gpus == 1 else 0
    from parallel.launch import free_port, init_from_env, spawn

    if _under_torchrun():
        rank, world_size, device = init_from_env()
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", gpus)) if device.type == "cuda" else 0
        recipe = resolve_recipe(args, gpus_per_node, memory)
        if rank == 0:
            print(f"recipe: {json.dumps(recipe.as_dict())}")
        try:
            result = rank_main(rank, world_size, device, args, recipe, launch_time)
        finally:
            import torch.distributed as dist

            dist.destroy_process_group()
        if rank == 0:
            report(result, args, recipe, argv)
        return 0 if not args.check or result["passed"] else 1
    if gpus and nproc > 1:
        if nproc > torch.cuda.device_count():
            raise ValueError(f"--ranks {nproc} exceeds the {torch.cuda.device_count()} GPUs of this machine")
        env = dict(os.environ, **{LAUNCH_TIME_ENV: repr(launch_time), ARGV_ENV: json.dumps(argv)})
        src = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        print(f"launching {nproc} ranks through torch.distributed.run")
        return subprocess.run(_torchrun_command(nproc), env=env).returncode
    recipe = resolve_recipe(args, gpus, memory)
    print(f"recipe: {json.dumps(recipe.as_dict())}")
    if gpus:  # one GPU, one process: a one-rank group so the sharded code path is the same
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            RANK="0",
            WORLD_SIZE="1",
            **{LAUNCH_TIME_ENV: repr(launch_time)},
        )
        return main(argv)
    result = spawn(
        _spawned, nproc, args, recipe, launch_time, backend="gloo", timeout=args.timeout, start_method="fork"
    )[0]
    report(result, args, recipe, argv)
    return 0 if not args.check or result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
