"""One command-line grammar for every benchmark: the same names for the same things, lists as repeated values.

    p = command_parser("python -m pkg.bench", __doc__)
    add_list(p, "--seqs", int, [512, 1024], "sequence lengths")   # --seqs 512 1024
    add_steps(p, steps=10, warmup=5)                               # --steps, --warmup
    add_dtypes(p, ["fp32", "bf16"])                                 # --dtypes fp32 bf16
    add_out(p, "results")                                           # --out
    add_device(p)                                                   # --device (auto: cuda when present)
    p.add_argument("--checkpoint", type=parsed_by(parse_strategy))  # a grammar of its own

Imports nothing heavy (no torch, no pandas), so a command that parses its arguments first answers
``--help`` at once.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DTYPE_NAMES = ("fp32", "bf16", "fp16")


def command_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser named ``prog`` whose description is the first paragraph of ``doc``; defaults shown in help."""
    description = (doc or "").strip().split("\n\n")[0]
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip


def _checked(cast: Callable[[str], Any], test: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    convert.__name__ = expected  # argparse names the type in its messages
    return convert


positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _checked(float, lambda v: v > 0 and v != float("inf"), "a positive finite number")
non_negative_float = _checked(float, lambda v: 0 <= v < float("inf"), "a finite number >= 0")


def parsed_by(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse type for a value with a grammar of its own: the text is kept when ``parse(text)``
    accepts it, and ``parse``'s ValueError, which names what was expected, becomes the usage error."""

    def convert(text: str) -> str:
        try:
            parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _one_value(cast: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    """``cast``, refusing the comma-separated form with a message that shows the repeated one."""

    def convert(text: str) -> Any:
        if "," in text:
            spaced = " ".join(part for part in text.split(",") if part)
            raise argparse.ArgumentTypeError(f"give the values separated by spaces: {flag} {spaced}")
        return cast(text)

    convert.__name__ = getattr(cast, "__name__", "value")
    return convert


def add_list(
    parser: argparse.ArgumentParser,
    flag: str,
    type: Callable[[str], Any] = str,
    default: Sequence | None = None,
    help: str = "",
    choices: Sequence | None = None,
    required: bool = False,
) -> argparse.Action:
    """``flag`` taking one or more values separated by spaces (``--seqs 512 1024``); a list after parsing."""
    return parser.add_argument(flag, nargs="+", type=_one_value(type, flag), choices=choices,
                               default=None if default is None else list(default), required=required,
                               help=help)  # fmt: skip


def _writable(text: str, folder: bool) -> str:
    """``text`` if a folder (``folder``) or file can be written there: the path, if it exists, is of that
    kind, and the folder it is in (or its nearest existing ancestor) is one this process may write into."""
    path = Path(text)
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if path.exists():
        if path.is_dir() != folder:
            raise argparse.ArgumentTypeError(f"{text} is a {other}, expected a {kind}")
        where = path if folder else path.parent
    else:
        where = next(p for p in path.parents if p.exists())
        if not where.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: {where} is a file, so it cannot be created")
    if not os.access(where, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write into {where}")
    return text


def writable_folder(text: str) -> str:
    """An argparse type: a folder that exists or can be created, and written into."""
    return _writable(text, folder=True)


def writable_file(text: str) -> str:
    """An argparse type: a file that can be written (created or replaced)."""
    return _writable(text, folder=False)


def add_out(
    parser: argparse.ArgumentParser, default: str = "results", help: str = "folder the result files go to"
) -> argparse.Action:
    """``--out``: the folder results are written to (never docs/ unless asked), checked when parsed."""
    return parser.add_argument("--out", type=writable_folder, default=default, help=help)


def add_steps(parser: argparse.ArgumentParser, steps: int, warmup: int) -> None:
    """``--steps`` (measured, >= 1) and ``--warmup`` (untimed before measuring, >= 0)."""
    parser.add_argument("--steps", type=positive_int, default=steps, help="measured steps")
    parser.add_argument("--warmup", type=non_negative_int, default=warmup,
                        help="untimed steps before measuring")  # fmt: skip


def add_dtypes(
    parser: argparse.ArgumentParser,
    default: Sequence[str],
    choices: Sequence[str] = DTYPE_NAMES,
    help: str = "precisions: fp32, or bf16 / fp16 autocast",
) -> argparse.Action:
    """``--dtypes`` as repeated values from ``choices``."""
    return add_list(parser, "--dtypes", str, default, help, choices=choices)


device_name = _checked(str, lambda v: re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None,
                       "auto, cpu, cuda or cuda:N")


def add_device(parser: argparse.ArgumentParser, default: str = "auto") -> argparse.Action:
    """``--device``: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when present: :func:`resolve_device`)."""
    return parser.add_argument("--device", type=device_name, default=default,
                               help="torch device; auto: cuda when present")  # fmt: skip


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when CUDA is available, else ``cpu``; other names unchanged, after checking that
    a CUDA one names a visible GPU (ValueError otherwise; imports torch)."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        index, visible = int(name.partition(":")[2] or 0), torch.cuda.device_count()
        if index >= visible:
            raise ValueError(f"--device {name}: {visible} CUDA GPU(s) visible" + (
                "" if visible else " (run on a GPU machine, or pass --device cpu)"))  # fmt: skip
    return name


def add_launch(parser: argparse.ArgumentParser, timeout: float) -> None:
    """``--backend`` (``auto``, ``nccl``, ``gloo``) and ``--timeout`` (seconds before workers are killed)
    of a command that starts a group of processes; resolve the backend with :func:`resolve_backend`."""
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="nccl: one GPU per process; gloo: CPU processes; auto: nccl when CUDA exists",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=timeout, help="seconds before the workers are killed"
    )


def resolve_backend(name: str, processes: int) -> str:
    """``auto`` -> ``nccl`` when CUDA is available, else ``gloo``; a ValueError when ``nccl`` would need more
    GPUs than there are (imports torch)."""
    import torch

    backend = name if name != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and processes > torch.cuda.device_count():
        raise ValueError(
            f"{processes} processes with nccl need {processes} GPUs, found {torch.cuda.device_count()}"
        )
    return backend
