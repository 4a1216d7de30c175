"""``python -m docs.tables [--check]``: rebuild the generated blocks of docs/*.md from the raw files."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.tables", description=__doc__)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; list the blocks that differ from the raw files and exit 1 if any",
    )
    args = parser.parse_args(argv)
    from . import stale_blocks, write_all

    if args.check:
        stale = stale_blocks()
        for line in stale:
            print(f"stale: {line}")
        return 1 if stale else 0
    for path in write_all():
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
