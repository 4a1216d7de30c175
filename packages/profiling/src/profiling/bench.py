"""End-to-end benchmark of the reference LM: forward, forward+backward, or a full AdamW training step.

    python -m profiling.bench --sizes small --modes train --dtypes bf16
    python -m profiling.bench --sizes small medium --contexts 256 1024 --modes forward train --compile both

times every combination of ``--sizes x --contexts x --modes x --dtypes x --compile`` (out-of-memory cells
marked ``OOM``), printing a line per step and per cell, and rewrites ``<out>/<name>.csv`` and ``.md``
after every cell. ``--memory-profile`` records the allocator history of each cell instead (see
``profiling.memory``). Timing and throughput: ``profiling.runner``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from harness import cli

from .options import ATTENTIONS, MODES, STRATEGY_NAMES, parse_strategy

OVERRIDES = ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads", "batch_size")
COMPILES = {"off": (False,), "on": (True,), "both": (False, True)}


@dataclass(frozen=True)
class BenchConfig:
    """What to time: the product of sizes (presets), contexts (None: the preset's), modes, dtypes and
    compiles; how (attention, checkpointing, steps, ranges, device); where the table goes."""

    sizes: tuple[str, ...] = ("small",)
    contexts: tuple[int | None, ...] = (None,)
    modes: tuple[str, ...] = ("train",)
    dtypes: tuple[str, ...] = ("fp32",)
    compiles: tuple[bool, ...] = (False,)
    overrides: dict[str, int] = field(default_factory=dict)  # preset fields replaced (d_model=..., ...)
    attention: str = "naive"
    checkpoint: str = "none"
    warmup: int = 5
    steps: int = 10
    ranges: bool = True
    device: str = "cuda"
    memory_profile: bool = False
    max_seconds: float | None = None
    out: str = "results"
    name: str = "bench"


def measure(config: BenchConfig):
    """The table of ``config``'s cells (a pandas DataFrame), also written under ``config.out``."""
    import pandas as pd

    from .memory_timeline import profile_memory
    from .runner import sweep
    from .workload import resolve_config

    models = [
        (size, resolve_config(size, context_length=ctx, **config.overrides))
        for size in config.sizes
        for ctx in config.contexts
    ]
    if config.memory_profile:
        rows = []
        for (size, model), mode, dtype in itertools.product(models, config.modes, config.dtypes):
            stem = f"memory-{size}-{model.context_length}-{mode}-{dtype}"
            rows.append(
                profile_memory(
                    size, model.context_length, mode, dtype, config.steps, config.out, stem, config.device
                )
            )
        return pd.DataFrame(rows)
    return sweep(
        models,
        config.modes,
        config.dtypes,
        config.compiles,
        Path(config.out) / config.name,
        max_seconds=config.max_seconds,
        attention=config.attention,
        checkpoint=config.checkpoint,
        warmup=config.warmup,
        steps=config.steps,
        device=config.device,
        verbose=True,
        ranges=config.ranges,
    )


def report(df) -> None:
    """Print the table as Markdown."""
    from harness.results import to_markdown

    print(to_markdown(df, ".4g"))


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    p = cli.command_parser("python -m profiling.bench", __doc__)
    cli.add_list(p, "--sizes", str, ["small"], "names of cs336_basics.presets, e.g. small xl 10B")
    cli.add_list(
        p, "--contexts", cli.positive_int, None, "context lengths (tokens per sequence); default the preset's"
    )
    cli.add_list(
        p, "--modes", str, ["train"], "forward (no_grad), forward-backward, train (with AdamW)", choices=MODES
    )
    cli.add_dtypes(
        p, ["fp32"], help="fp32, or bf16 / fp16 autocast around forward and loss (fp32 parameters)"
    )
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="off",
        choices=tuple(COMPILES),
        help="torch.compile the model (bare flag = on; both: each cell with and without)",
    )
    for name in OVERRIDES:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=cli.positive_int, help=f"override the presets' {name}"
        )
    p.add_argument(
        "--attention",
        choices=ATTENTIONS,
        default="naive",
        help="naive (reference math with ranges) or flash (flashattn.flash_attention)",
    )
    p.add_argument(
        "--checkpoint",
        type=cli.parsed_by(parse_strategy),
        default="none",
        help=f"activation checkpointing: one of {', '.join(STRATEGY_NAMES)}",
    )
    cli.add_steps(p, steps=10, warmup=5)
    p.add_argument("--no-ranges", action="store_true", help="switch the NVTX / profiler ranges off")
    cli.add_device(p)
    p.add_argument(
        "--memory-profile",
        action="store_true",
        help="instead of timing, record the allocator history of --steps steps of each cell and "
        "write the memory_viz pickle, a PNG timeline and the largest allocations under --out",
    )
    p.add_argument(
        "--max-seconds",
        type=cli.positive_float,
        help="mark the cells that would start after this long skipped",
    )
    cli.add_out(p, "results", "folder for the table")
    p.add_argument("--name", default="bench", help="file stem of the table: <name>.csv and <name>.md")
    args = p.parse_args(argv)
    return BenchConfig(
        sizes=tuple(args.sizes),
        contexts=tuple(args.contexts or [None]),
        modes=tuple(args.modes),
        dtypes=tuple(args.dtypes),
        compiles=COMPILES[args.compile],
        overrides={k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None},
        attention=args.attention,
        checkpoint=args.checkpoint,
        warmup=args.warmup,
        steps=args.steps,
        ranges=not args.no_ranges,
        device=cli.resolve_device(args.device),
        memory_profile=args.memory_profile,
        max_seconds=args.max_seconds,
        out=args.out,
        name=args.name,
    )


def main(argv: list[str] | None = None):
    """The command: parse ``argv``, measure, print and return the table."""
    df = measure(parse_args(argv))
    report(df)
    return df


if __name__ == "__main__":
    main()
