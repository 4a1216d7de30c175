"""Kernel tables per named range (forward, backward, optimizer_step, block, attention parts), from a profile.

    python -m profiling.kernels --sizes small --contexts 256 1024 --modes forward train

profiles ``--steps`` steps of every configuration after ``--warmup`` and writes ``<out>/<name>.csv/.md``
(each range's kernels by GPU time, calls and share per step) and ``<name>-summary.csv/.md`` (one row per
range); how kernels are attributed to ranges: ``profiling.kernel_attribution``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from harness import cli

from .options import MODES


@dataclass(frozen=True)
class KernelsConfig:
    """The product of sizes x contexts x modes x dtypes to profile, and where the tables go."""

    sizes: tuple[str, ...] = ("small",)
    contexts: tuple[int, ...] = (512,)
    modes: tuple[str, ...] = ("forward", "train")
    dtypes: tuple[str, ...] = ("fp32",)
    steps: int = 3
    warmup: int = 2
    device: str = "cuda"
    out: str = "results"
    name: str = "kernels"


def measure(config: KernelsConfig):
    """Kernel table and range summary (DataFrames) of every configuration, each printed as it finishes."""
    import pandas as pd
    from harness.progress import progress
    from harness.results import to_markdown

    from .kernel_attribution import profile_config, short_names

    kernels, summaries = [], []
    cells = itertools.product(config.sizes, config.contexts, config.modes, config.dtypes)
    for size, context, mode, dtype in progress(cells, "profile", lambda c: " ".join(map(str, c))):
        k, s = profile_config(size, context, mode, dtype, config.steps, config.warmup, config.device)
        kernels.append(k)
        summaries.append(s)
        print(to_markdown(short_names(s), ".3g"), flush=True)
    return pd.concat(kernels), pd.concat(summaries)


def report(kernels, summary, config: KernelsConfig) -> None:
    """Write both tables (kernel names cut at 120 characters) under ``config.out``."""
    from harness.results import write_table

    from .kernel_attribution import short_names

    write_table(short_names(kernels, 120), Path(config.out) / config.name)
    write_table(short_names(summary, 120), Path(config.out) / f"{config.name}-summary")


def parse_args(argv: list[str] | None = None) -> KernelsConfig:
    p = cli.command_parser("python -m profiling.kernels", __doc__)
    cli.add_list(p, "--sizes", str, ["small"], "model presets")
    cli.add_list(p, "--contexts", cli.positive_int, [512], "context lengths")
    cli.add_list(p, "--modes", str, ["forward", "train"], "modes", choices=MODES)
    cli.add_dtypes(p, ["fp32"])
    cli.add_steps(p, steps=3, warmup=2)
    cli.add_device(p)
    cli.add_out(p)
    p.add_argument("--name", default="kernels", help="file stem: <name>.csv/.md and <name>-summary.csv/.md")
    args = p.parse_args(argv)
    return KernelsConfig(
        tuple(args.sizes),
        tuple(args.contexts),
        tuple(args.modes),
        tuple(args.dtypes),
        args.steps,
        args.warmup,
        cli.resolve_device(args.device),
        args.out,
        args.name,
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    report(*measure(config), config)


if __name__ == "__main__":
    main()
