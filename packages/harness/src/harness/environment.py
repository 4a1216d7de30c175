"""The header of every result: device, library versions, date and the exact command that produced it."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import sys


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def command_line(argv: list[str] | None = None) -> str:
    """How this process was started, as a shell line: ``python -m pkg.mod args`` for a module run."""
    argv = sys.argv if argv is None else argv
    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None)
    head = ["python", "-m", module.removesuffix(".__main__")] if module else ["python", argv[0]]
    return shlex.join([*head, *argv[1:]])


def environment(command: str | None = None) -> dict[str, str]:
    """``date`` (UTC, to the minute), ``python``, ``torch``, ``triton``, ``cuda``, ``cudnn``, ``nccl``,
    ``device`` (``2 x NVIDIA H200`` or ``CPU (16 cores, x86_64)``) and ``command`` (default: this
    process's :func:`command_line`), all strings, for a result file's header or a table's columns."""
    import torch

    info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda or "none",
    }
    if torch.cuda.is_available():
        info["cudnn"] = str(torch.backends.cudnn.version())
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["device"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    else:
        info["cudnn"] = info["nccl"] = "none"
        info["device"] = f"CPU ({os.cpu_count()} cores, {platform.machine()})"
    info["command"] = command if command is not None else command_line()
    return info


def header_markdown(env: dict[str, str]) -> str:
    """One Markdown paragraph naming the device, versions, date and command of ``env``."""
    return (f"Measured on {env['device']} with torch {env['torch']}, triton {env['triton']}, CUDA "
            f"{env['cuda']}, Python {env['python']}, on {env['date']}, by `{env['command']}`.")  # fmt: skip
