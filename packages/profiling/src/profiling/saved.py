"""What one Transformer block saves for backward, by operation, and the size of its gradients.

    python -m profiling.saved --preset xl --context 512

prints the top operations by bytes saved for backward with their shares, next to the analytic count
(``analysis.accounting``), and the block's gradient bytes (``profiling.saved_tensors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import cli


@dataclass(frozen=True)
class SavedConfig:
    preset: str = "small"
    context: int | None = None  # None: the preset's
    batch: int | None = None  # None: the preset's
    dtype: str = "fp32"
    top: int = 5
    device: str = "cuda"


def measure(config: SavedConfig) -> dict:
    """:func:`profiling.saved_tensors.block_report` of block 0 of the configured model."""
    from .saved_tensors import block_report
    from .workload import resolve_config

    model = resolve_config(config.preset, context_length=config.context, batch_size=config.batch)
    return block_report(model, config.dtype, config.device)


def report(result: dict, config: SavedConfig) -> None:
    from harness.results import to_markdown

    print(to_markdown(result["table"].head(config.top + 1), ".2f"))
    print({k: round(v, 2) for k, v in result.items() if k != "table"})


def parse_args(argv: list[str] | None = None) -> SavedConfig:
    p = cli.command_parser("python -m profiling.saved", __doc__)
    p.add_argument("--preset", default="small", help="model preset")
    p.add_argument("--context", type=cli.positive_int, help="context length (default the preset's)")
    p.add_argument("--batch", type=cli.positive_int, help="batch size (default the preset's)")
    p.add_argument("--dtype", choices=cli.DTYPE_NAMES, default="fp32", help="fp32, or bf16 / fp16 autocast")
    p.add_argument("--top", type=cli.positive_int, default=5, help="operations to list")
    cli.add_device(p)
    args = p.parse_args(argv)
    return SavedConfig(
        args.preset, args.context, args.batch, args.dtype, args.top, cli.resolve_device(args.device)
    )


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    report(measure(config), config)


if __name__ == "__main__":
    main()
