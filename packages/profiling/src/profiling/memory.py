"""Memory profile of a few steps: the memory_viz snapshot, an active-memory timeline, the largest allocations.

    python -m profiling.memory --preset xl --context 2048 --mode train --dtype bf16 --out results

writes ``<stem>.pickle`` (open it at https://pytorch.org/memory_viz), ``<stem>.png`` (the timeline, phases
shaded, peak marked) and ``<stem>-largest.csv/.md`` under ``--out`` (see ``profiling.memory_timeline``).
CUDA only.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import cli

from .options import MODES


@dataclass(frozen=True)
class MemoryConfig:
    """One configuration to record: preset, context, mode, dtype, steps; files ``<out>/<stem>*``."""

    preset: str = "small"
    context: int = 512
    mode: str = "train"
    dtype: str = "fp32"
    steps: int = 2
    out: str = "results"
    stem: str | None = None  # default memory-<preset>-<context>-<mode>-<dtype>


def measure(config: MemoryConfig):
    """Record and write the files; the peak-table row as a one-row DataFrame."""
    import pandas as pd

    from .memory_timeline import profile_memory

    stem = config.stem or f"memory-{config.preset}-{config.context}-{config.mode}-{config.dtype}"
    return pd.DataFrame(
        [
            profile_memory(
                config.preset, config.context, config.mode, config.dtype, config.steps, config.out, stem
            )
        ]
    )


def parse_args(argv: list[str] | None = None) -> MemoryConfig:
    p = cli.command_parser("python -m profiling.memory", __doc__)
    p.add_argument("--preset", default="small", help="model preset")
    p.add_argument("--context", type=cli.positive_int, default=512, help="context length")
    p.add_argument("--mode", choices=MODES, default="train", help="forward, forward-backward or train")
    p.add_argument("--dtype", choices=cli.DTYPE_NAMES, default="fp32", help="fp32 or bf16 / fp16 autocast")
    p.add_argument("--steps", type=cli.positive_int, default=2, help="recorded steps")
    cli.add_out(p)
    p.add_argument("--stem", help="file stem (default memory-<preset>-<context>-<mode>-<dtype>)")
    return MemoryConfig(**vars(p.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    from harness.results import to_markdown

    print(to_markdown(measure(parse_args(argv)), ".3f"))


if __name__ == "__main__":
    main()
