"""End-to-end benchmark of the reference LM: forward, forward+backward, or a full AdamW training step.

``python -m profiling.bench --preset small --mode train --dtype bf16`` times one configuration;
``--sweep`` times every combination of ``--sizes x --contexts x --modes x --dtypes x --compile`` and
writes ``<out>/<name>.csv`` and ``.md`` after every row (out-of-memory cells marked ``OOM``).

Each measured step is synchronized and timed with ``timeit.default_timer`` (see
:mod:`profiling.timing`); throughput counts FLOPs with ``analysis.accounting`` (model FLOPs: no
recomputation from checkpointing). Limits: one device; ``--compile`` drops the in-model ranges
(blocks, attention parts) so the graph is not broken; the first compiled step includes compilation,
so use warm-up steps with it.
"""

from __future__ import annotations

import argparse
import itertools
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import torch
from analysis.accounting import forward_flops, mfu, train_step_flops
from cs336_basics import ModelConfig
from tqdm import tqdm

from . import ranges
from .checkpointing import STRATEGY_NAMES
from .memory import profile_memory
from .tables import write_table
from .timing import summarize, time_steps
from .workload import ATTENTIONS, DTYPES, MODES, Workload, free_device_memory, is_oom, resolve_config

SIZES = ("small", "medium", "large", "xl", "10B")


def step_flops(config: ModelConfig, mode: str) -> float:
    """Model FLOPs of one step of ``mode`` (forward, or forward + backward) on a full batch."""
    batch, seq = config.batch_size, config.context_length
    if mode == "forward":
        return forward_flops(config, batch, seq)
    return train_step_flops(config, batch, seq)


def run_config(
    config: ModelConfig,
    mode: str,
    dtype: str = "fp32",
    compile: bool = False,
    attention: str = "naive",
    checkpoint: str = "none",
    warmup: int = 5,
    steps: int = 10,
    device: str = "cuda",
) -> dict:
    """Benchmark one configuration; a row with status ``ok`` or ``OOM``, times in ms, ``step_ms`` list.

    Other exceptions propagate. The model and its memory are released before returning.
    """
    row = {
        "d_model": config.d_model, "num_layers": config.num_layers, "context": config.context_length,
        "batch": config.batch_size, "mode": mode, "dtype": dtype, "compile": compile, "attention": attention,
        "checkpoint": checkpoint, "warmup": warmup, "steps": steps,
    }
    workload = None
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    start = timeit.default_timer()
    try:
        workload = Workload(config, mode, dtype, compile, attention, checkpoint, device)
        times = time_steps(workload.step, warmup, steps, device)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        row["status"] = "OOM"
    else:
        row["status"] = "ok"
        row.update(summarize(times))
        flops = step_flops(config, mode)
        row["tflops"] = flops / (row["mean_ms"] * 1e-3) / 1e12
        row["mfu_bf16_peak"] = mfu(flops, row["mean_ms"] * 1e-3)
        row["step_ms"] = [round(t * 1e3, 3) for t in times]
    finally:
        if workload is not None:
            workload.close()
        del workload
        if compile:
            torch._dynamo.reset()
        free_device_memory()
    if device.startswith("cuda"):
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    row["wall_s"] = timeit.default_timer() - start
    return row


def sweep(
    configs: Iterable[tuple[str, ModelConfig]],
    modes: Iterable[str],
    dtypes: Iterable[str],
    compiles: Iterable[bool],
    out_stem: str | Path,
    run: Callable[..., dict] = run_config,
    max_seconds: float | None = None,
    steps_for: Callable[[str], tuple[int, int]] | None = None,
    **kwargs,
) -> pd.DataFrame:
    """Run ``run`` over the product of configurations and options, rewriting the table after each row.

    ``steps_for(size)`` may give ``(warmup, steps)`` per size; cells after ``max_seconds`` are marked
    ``skipped``. A configuration that ran out of memory in a mode makes its more demanding modes
    (forward -> forward-backward -> train) ``OOM (implied)`` without running them.
    """
    cells = list(itertools.product(list(configs), list(modes), list(dtypes), list(compiles)))
    rows: list[dict] = []
    oom_at: dict[tuple, int] = {}
    start = timeit.default_timer()
    for (size, config), mode, dtype, compiled in tqdm(cells, desc="sweep", unit="cell"):
        key = (size, config.context_length, dtype, compiled)
        base = {"size": size}
        if key in oom_at and MODES.index(mode) > oom_at[key]:
            row = {**base, "context": config.context_length, "mode": mode, "dtype": dtype,
                   "compile": compiled, "status": "OOM (implied)"}
        elif max_seconds is not None and timeit.default_timer() - start > max_seconds:
            row = {**base, "context": config.context_length, "mode": mode, "dtype": dtype,
                   "compile": compiled, "status": "skipped (time budget)"}
        else:
            extra = dict(kwargs)
            if steps_for is not None:
                extra["warmup"], extra["steps"] = steps_for(size)
            row = {**base, **run(config, mode, dtype=dtype, compile=compiled, **extra)}
            if row["status"] == "OOM":
                oom_at[key] = min(oom_at.get(key, len(MODES)), MODES.index(mode))
        rows.append(row)
        tqdm.write(_describe(row))
        write_table(_table(rows), out_stem)
    return _table(rows)


def _describe(row: dict) -> str:
    what = f"{row['size']} ctx={row['context']} {row['mode']} {row['dtype']} compile={row['compile']}"
    if row["status"] != "ok":
        return f"{what}: {row['status']}"
    return f"{what}: {row['mean_ms']:.2f} ± {row['std_ms']:.2f} ms, {row['tflops']:.1f} TFLOP/s"


def _table(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    return df.drop(columns=["step_ms"], errors="ignore")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m profiling.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small", help="model preset (cs336_basics.presets); default small")
    for field in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads"):
        p.add_argument(f"--{field.replace('_', '-')}", type=int, help=f"override the preset's {field}")
    p.add_argument("--context", type=int, help="context length (tokens per sequence); default the preset's")
    p.add_argument("--batch", type=int, help="batch size (sequences); default the preset's")
    p.add_argument("--mode", choices=MODES, default="train",
                   help="forward (no_grad), forward-backward, or train (with AdamW); default train")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="fp32, or bf16 / fp16 autocast around forward and loss (fp32 parameters)")
    p.add_argument("--compile", nargs="?", const="on", default="off", choices=("off", "on", "both"),
                   help="torch.compile the model (bare flag = on; 'both' only makes sense with --sweep)")
    p.add_argument("--attention", choices=ATTENTIONS, default="naive",
                   help="naive (reference math with ranges) or flash (flashattn.flash_attention)")
    p.add_argument("--checkpoint", default="none",
                   help=f"activation checkpointing: one of {', '.join(STRATEGY_NAMES)}; default none")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before measuring (default 5)")
    p.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    p.add_argument("--no-ranges", action="store_true", help="switch the NVTX / profiler ranges off")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default cuda when present)")
    p.add_argument("--memory-profile", action="store_true",
                   help="instead of timing, record the allocator history of --steps steps of --preset at "
                        "--context (mode, dtype as given) and write the memory_viz pickle, a PNG timeline "
                        "and the largest allocations under --out (see profiling.memory)")
    p.add_argument("--sweep", action="store_true",
                   help="run the product of --sizes, --contexts, --modes, --dtypes")
    p.add_argument("--sizes", default=",".join(SIZES), help="comma-separated presets for --sweep")
    p.add_argument("--contexts", default="512", help="comma-separated context lengths for --sweep")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes for --sweep")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated dtypes for --sweep")
    p.add_argument("--max-seconds", type=float, help="--sweep: mark cells after this many seconds skipped")
    p.add_argument("--out", default="results", help="folder for the --sweep table (default results)")
    p.add_argument("--name", default="bench", help="file stem of the --sweep table (default bench)")
    args = p.parse_args(argv)
    if args.compile == "both" and not args.sweep:
        p.error("--compile both needs --sweep")
    return args


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x]


def run_cli(argv: list[str] | None = None) -> pd.DataFrame:
    """The command: parse ``argv``, run, print and return the table."""
    args = parse_args(argv)
    ranges.set_enabled(not args.no_ranges)
    overrides = {f: getattr(args, f) for f in ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads")}
    overrides["batch_size"] = args.batch
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    common = dict(attention=args.attention, checkpoint=args.checkpoint, warmup=args.warmup, steps=args.steps,
                  device=args.device)
    if args.memory_profile:
        config = resolve_config(args.preset, context_length=args.context)
        stem = f"memory-{args.preset}-{config.context_length}-{args.mode}-{args.dtype}"
        row = profile_memory(args.preset, config.context_length, args.mode, args.dtype, args.steps, args.out,
                             stem, args.device)
        df = pd.DataFrame([row])
    elif args.sweep:
        configs = [(size, resolve_config(size, context_length=ctx, **overrides))
                   for size in _csv(args.sizes) for ctx in _csv(args.contexts, int)]
        df = sweep(configs, _csv(args.modes), _csv(args.dtypes), compiles, Path(args.out) / args.name,
                   max_seconds=args.max_seconds, **common)
    else:
        config = resolve_config(args.preset, context_length=args.context, **overrides)
        row = {"size": args.preset, **run_config(config, args.mode, args.dtype, compiles[0], **common)}
        print(_describe(row))
        df = _table([row])
    print(df.to_markdown(index=False, floatfmt=".4g"))
    return df


def main(argv: list[str] | None = None) -> None:
    run_cli(argv)


if __name__ == "__main__":
    main()
