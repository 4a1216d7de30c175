"""``python -m analysis.report``: the parallelism analysis and accounting report, in Markdown.

Every formula in the file is computed here (sympy, printed with ``sympy.latex``), every check is run
here (ring simulator on real arrays, tensor-parallel backward against autograd, FLOPs against torch's FLOP
counter). The H200 numbers use ``C``, the constant ``H200_MEASURED_BF16_MATMUL_FLOPS`` of
``analysis.accounting`` (or ``--matmul-tflops``), and ``W``, the all-reduce bus bandwidth read from the
repository's ``docs/collectives.csv`` (or ``--bandwidth-gbps``). Writes ``results/analysis.md`` unless
``--out`` says otherwise. The tracked report is ``--out docs/analysis.md`` followed by ``python -m
docs.tables``, which fills the blocks that come from measurement files (``<!-- gen:NAME -->``). Runs on a
CPU in under a minute; it measures nothing on a GPU itself. Sections: ``analysis.parallelism_report`` and
``analysis.accounting_report``; the model configurations are the presets of ``cs336_basics.presets``.
"""

from __future__ import annotations

import csv
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import cli

from .accounting import H200_MEASURED_BF16_MATMUL_FLOPS

REPOSITORY_DOCS = Path(__file__).resolve().parents[4] / "docs"
REPOSITORY_COLLECTIVES = REPOSITORY_DOCS / "collectives.csv"
MAX_RING = 64  # --max-ring: 16 and 32 take about 11 s in all on 2 CPU cores, 64 about 20 s
"""The tracked collective benchmark table of a source checkout (absent when installed elsewhere)."""


def _column(row: dict[str, str], *names: str) -> str:
    for name in names:
        if row.get(name) not in (None, ""):
            return row[name]
    raise KeyError(f"none of the columns {names} in {sorted(row)}")


def read_bus_bandwidth(path: Path) -> tuple[float, str] | None:
    """All-reduce bus bandwidth (bytes/s) of the largest message in a collective benchmark CSV, or ``None``.

    Reads ``parallel_bench.collectives``' table (``collective, processes, size_bytes, busbw_GBps`` and
    ``backend``) or one with columns ``op, world_size, size_bytes, busbw`` (GB/s unless above 1e6, then
    bytes/s). Only NCCL rows count when a backend column exists (gloo on CPUs says nothing about GPUs);
    prefers 2 ranks, else the fewest.
    """
    if not path.is_file():
        return None
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    try:
        picked = [
            (
                int(float(_column(r, "processes", "world_size"))),
                float(r["size_bytes"]),
                float(_column(r, "busbw_GBps", "busbw")),
                r.get("device") or "",
                r.get("date") or "",
            )
            for r in rows
            if _column(r, "collective", "op").lower().replace("-", "_") == "all_reduce"
            and r.get("backend", "nccl").lower() == "nccl"
        ]
    except (KeyError, ValueError) as err:
        raise ValueError(f"{path}: cannot read all-reduce bus bandwidth ({err})") from err
    if not picked:
        return None
    ranks = 2 if any(row[0] == 2 for row in picked) else min(row[0] for row in picked)
    _, size, value, device, date = max((row for row in picked if row[0] == ranks), key=lambda row: row[1])
    busbw = value if value > 1e6 else value * 1e9
    measured = f" ({device}, {date})" if device or date else ""
    source = (
        f"`{path.name}`: NCCL all-reduce of {size / 2**20:.0f} MiB on {ranks} GPUs{measured}, "
        f"bus bandwidth {busbw / 1e9:.0f} GB/s"
    )
    return busbw, source


def lowest_matmul_rate(folder: Path = REPOSITORY_DOCS / "data") -> float | None:
    """The lowest bf16 matmul rate (FLOP/s) in the matmul measurement files ``matmul-rate-*.csv`` of
    ``folder`` (column ``tflops``), or ``None`` when there are none."""
    rates = []
    for path in sorted(folder.glob("matmul-rate-*.csv")):
        with path.open(newline="") as handle:
            try:
                rates += [float(row["tflops"]) * 1e12 for row in csv.DictReader(handle)]
            except (KeyError, ValueError) as err:
                raise ValueError(f"{path}: cannot read the matmul rate ({err})") from err
    return min(rates) if rates else None


def c_note(matmul_flops: float, from_constant: bool, lowest: float | None) -> str:
    """Where C comes from, and how far the measured matmul rates lie from it."""
    from .markdown import generated

    if not from_constant:
        return "from the command line (the datasheet's dense peak is 989)."
    note = (
        "is the constant `H200_MEASURED_BF16_MATMUL_FLOPS` of `analysis.accounting`, not a value read from a "
        "measurement file (the datasheet's dense peak is 989). The project's own measurements of that bf16 "
        f"8192^3 matmul (`flashattn_bench.util.matmul_tflops`) give {generated('matmul-rate')}, and "
        f"{generated('flashattn.matmul-logs')}."
    )
    if lowest is not None and lowest < matmul_flops:
        note += (
            " Every GPU count below scales as W / C, so the lowest measured rate would raise them by up to "
            f"{100 * (matmul_flops / lowest - 1):.0f}%."
        )
    return note


def build_report(
    matmul_flops: float,
    bandwidth: float,
    source: str,
    max_n: int,
    command: str,
    c_text: str,
    inputs: str,
    models: Mapping[str, Any],
) -> str:
    """The whole document: a header naming the command, versions and date, then every section.

    ``c_text``: where C comes from (:func:`c_note`); ``inputs``: the header's words on C's and W's origin;
    ``models``: preset name -> model config, one accounting row each (:func:`reported_models`).
    """
    import numpy as np
    import sympy as sp
    from harness.environment import environment

    from .accounting_report import accounting_section, checkpointing_section
    from .parallelism_report import collectives_section, h200_section, strategy_section, tp_check_section

    env = environment(command)
    header = [
        "# Parallelism analysis and accounting",
        "",
        f"Generated by `{command}` on {env['date']} with sympy {sp.__version__}, torch {env['torch']}, "
        f"triton {env['triton']} (unused), numpy {np.__version__}, Python {env['python']}, on "
        f"{env['device']}. Nothing here is timed: the GPU numbers are inputs ({inputs}), and every "
        f"formula is derived and checked by the command.",
        "",
    ]
    sections = [
        collectives_section(max_n),
        strategy_section(),
        tp_check_section(),
        h200_section(matmul_flops, bandwidth, source, c_text, models),
        accounting_section(models),
        checkpointing_section(models["xl"]),
    ]
    return "\n".join(header) + "\n" + "\n\n".join([answers_section(sections), *sections]) + "\n"


def _anchor(title: str) -> str:
    """The link target a Markdown renderer gives the heading ``title`` (lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def answers_section(sections: list[str]) -> str:
    """``## Answers``: for each section, its title linked and the first sentence of its first bold-led
    paragraph (else of its first paragraph of prose holding a sentence), so the answers come before the
    derivations."""
    lines = ["## Answers", ""]
    for section in sections:
        title, _, body = section.removeprefix("## ").partition("\n")
        prose = [p.strip() for p in body.split("\n\n") if p.strip()[:1] not in "|$"]
        paragraphs = [p for p in prose if re.search(r"\.(\s|$)", p)]
        led = [p for p in paragraphs if p.startswith("**") and not p.startswith("**Simulator")]
        first = (led or paragraphs)[0]
        lead = re.match(r"\*\*(.+?)\*\*\s*", first)
        rest = first[lead.end():] if lead else first
        sentence = re.match(r"(.+?[^.]\.)(\s|$)", rest, re.S)
        text = (sentence.group(1) if sentence else rest).replace("\n", " ")
        label = f"{lead.group(1).rstrip('.')}: " if lead and lead.group(1) != "Answer." else ""
        lines.append(f"- **[{title}](#{_anchor(title)})**: {label}{text}")
    return "\n".join(lines)


def reported_models() -> dict[str, Any]:
    """The presets the report covers: the standard sizes and ``leaderboard-8b``, from
    ``cs336_basics.presets`` (the one place they are defined)."""
    from cs336_basics.presets import PRESETS, STANDARD_SIZES

    return {name: PRESETS[name] for name in (*STANDARD_SIZES, "leaderboard-8b")}


def parse_args(argv: list[str] | None = None):
    parser = cli.command_parser("python -m analysis.report", __doc__)
    parser.add_argument(
        "--out",
        type=lambda text: Path(cli.writable_file(text)),
        default="results/analysis.md",
        help="Markdown file to write (docs/analysis.md: the tracked report)",
    )
    parser.add_argument(
        "--collectives-csv",
        type=Path,
        default=REPOSITORY_COLLECTIVES,
        help="collective benchmark table written by python -m parallel_bench.collectives; its largest NCCL "
        "all-reduce (on 2 GPUs if present) gives W; ignored if missing or if --bandwidth-gbps is given",
    )
    parser.add_argument(
        "--bandwidth-gbps",
        type=cli.positive_float,
        default=None,
        help="per-device bandwidth W in GB/s (default: from --collectives-csv)",
    )
    parser.add_argument(
        "--matmul-tflops",
        type=cli.positive_float,
        default=None,
        help="accelerator rate C in TFLOP/s (default: the constant H200_MEASURED_BF16_MATMUL_FLOPS, "
        f"{H200_MEASURED_BF16_MATMUL_FLOPS / 1e12:.0f})",
    )
    parser.add_argument(
        "--max-ring",
        type=cli.positive_int,
        default=16,
        help=f"largest ring size N for the simulator check (2 to {MAX_RING}; its time grows steeply with N)",
    )
    args = parser.parse_args(argv)
    if not 2 <= args.max_ring <= MAX_RING:
        parser.error(f"--max-ring must be from 2 to {MAX_RING}, got {args.max_ring}")
    return args


def main(argv: list[str] | None = None) -> Path:
    from harness.results import atomic_write_text

    args = parse_args(argv)
    if args.bandwidth_gbps is not None:
        bandwidth, source = args.bandwidth_gbps * 1e9, "the command line"
    else:
        measured = read_bus_bandwidth(args.collectives_csv)
        if measured is None:
            raise SystemExit(
                f"--collectives-csv {args.collectives_csv}: no NCCL all-reduce found (run python -m "
                "parallel_bench.collectives on GPUs), so W is unknown; pass --bandwidth-gbps"
            )
        bandwidth, source = measured
    from_constant = args.matmul_tflops is None
    matmul_flops = H200_MEASURED_BF16_MATMUL_FLOPS if from_constant else args.matmul_tflops * 1e12
    c_text = c_note(matmul_flops, from_constant, lowest_matmul_rate() if from_constant else None)
    inputs = (
        "C, a constant of `analysis.accounting` described below"
        if from_constant
        else "C from the command line"
    ) + (
        ", and W from the command line"
        if args.bandwidth_gbps is not None
        else ", and W from the collective benchmark"
    )
    command = "python -m analysis.report " + " ".join(sys.argv[1:] if argv is None else argv)
    print(
        f"deriving and checking (C = {matmul_flops / 1e12:.0f} TFLOP/s, W = {bandwidth / 1e9:.0f} GB/s) ..."
    )
    text = build_report(
        matmul_flops, bandwidth, source, args.max_ring, command.strip(), c_text, inputs, reported_models()
    )
    atomic_write_text(args.out, text)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
