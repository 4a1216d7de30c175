"""Mixed precision, observed: accumulation error by dtype, and the dtypes autocast actually produces.

    python -m profiling.precision --out results

prints (and with ``--out`` writes as CSV + Markdown) the accumulation table (0.01 summed a thousand times in
fp32, fp16 and mixed accumulators) and the dtypes of a toy model's tensors under fp16 and bf16 autocast,
read off the tensors (``profiling.mixed_precision``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import cli


@dataclass(frozen=True)
class PrecisionConfig:
    device: str = "cpu"  # where the autocast run happens
    out: str | None = None  # folder for the tables; None: print only


def measure(config: PrecisionConfig):
    """The accumulation table and the autocast-dtype table (fp16, then bf16)."""
    import pandas as pd

    from .mixed_precision import accumulation_table, autocast_dtypes

    dtypes = pd.concat([autocast_dtypes("fp16", config.device), autocast_dtypes("bf16", config.device)])
    return accumulation_table(), dtypes


def report(accumulation, dtypes, config: PrecisionConfig) -> None:
    from harness.results import to_markdown, write_table

    print(to_markdown(accumulation, ".8g"))
    print(to_markdown(dtypes))
    if config.out:
        write_table(accumulation, Path(config.out) / "precision-accumulation", floatfmt=".8g")
        write_table(dtypes, Path(config.out) / "precision-autocast")


def parse_args(argv: list[str] | None = None) -> PrecisionConfig:
    p = cli.command_parser("python -m profiling.precision", __doc__)
    cli.add_device(p)
    p.add_argument("--out", help="folder for the precision-accumulation and precision-autocast tables")
    args = p.parse_args(argv)
    return PrecisionConfig(cli.resolve_device(args.device), args.out)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    report(*measure(config), config)


if __name__ == "__main__":
    main()
