"""Byte-level token files from text at hand: ``python -m leaderboard.tokens --out DIR``.

Reads the ``.py`` sources of this Python's standard library (sorted by path, so the same installation
gives the same files), takes their UTF-8 bytes as token ids 0-255 and writes ``DIR/train.bin`` (the first
files) and ``DIR/valid.bin`` (the last ``--valid-fraction`` of the files, none split) as flat uint16 arrays,
the format ``train.py --data`` reads, plus ``DIR/tokens.json`` saying what went in.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path


def source_files(root: Path) -> list[Path]:
    """The standard library's ``.py`` files under ``root`` (without site-packages), sorted."""
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())


def write_tokens(out: Path, root: Path, valid_fraction: float = 0.05, max_bytes: int | None = None) -> dict:
    """Write ``train.bin`` and ``valid.bin`` under ``out``; returns the description also saved as JSON."""
    import numpy as np
    from harness.results import atomic_path, atomic_write_text

    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1 or None (no limit), got {max_bytes}")
    files = source_files(root)
    if not files:
        raise ValueError(f"--stdlib {root}: no .py files found")
    out.mkdir(parents=True, exist_ok=True)
    cut = max(1, min(len(files) - 1, round(len(files) * (1 - valid_fraction))))
    sizes = {}
    for name, part in (("train", files[:cut]), ("valid", files[cut:])):
        data = b"".join(p.read_bytes() for p in part)[:max_bytes]
        with atomic_path(out / f"{name}.bin") as tmp:
            np.frombuffer(data, dtype=np.uint8).astype(np.uint16).tofile(tmp)
        sizes[name] = {"files": len(part), "tokens": len(data), "first": str(part[0].relative_to(root))}
    description = {
        "source": f"UTF-8 bytes of the .py files of the Python {sys.version.split()[0]} standard library "
        f"({root})",
        "token_ids": "bytes 0-255 as uint16",
        **sizes,
    }
    atomic_write_text(out / "tokens.json", json.dumps(description, indent=2) + "\n")
    return description


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for train.bin, valid.bin, tokens.json"
    )
    parser.add_argument(
        "--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]), help="folder of .py sources"
    )
    parser.add_argument("--valid-fraction", type=float, default=0.05, help="share of the files held out")
    parser.add_argument(
        "--max-bytes", type=int, default=None, help="tokens kept of train.bin and of valid.bin (>= 1)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.valid_fraction < 1:
        parser.error(f"--valid-fraction must lie in (0, 1), got {args.valid_fraction}")
    if args.max_bytes is not None and args.max_bytes < 1:
        parser.error(f"--max-bytes must be >= 1 (leave it out for no limit), got {args.max_bytes}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, expected a folder")
    print(json.dumps(write_tokens(args.out, args.stdlib, args.valid_fraction, args.max_bytes), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
