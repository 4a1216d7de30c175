"""Generated blocks of ``docs/*.md``: every table and number that comes from a raw file, rebuilt by code.

A generated block sits between ``<!-- gen:NAME -->`` and ``<!-- /gen -->`` in a Markdown file; ``NAME`` is a
function registered with :func:`block` that reads the raw files (CSV, logs) and returns the block's text.
``python -m docs.tables`` (from the repository root) rewrites every block; ``--check`` only reports the
blocks whose text differs from what the raw files give, and fails if any does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = re.compile(r"<!-- gen:(?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /gen -->", re.DOTALL)
REGISTRY: dict[str, Callable[[], str]] = {}


def block(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register ``fn`` as the generator of the blocks called ``name``."""

    def register(fn: Callable[[], str]) -> Callable[[], str]:
        if name in REGISTRY:
            raise ValueError(f"generated block {name!r} is registered twice")
        REGISTRY[name] = fn
        return fn

    return register


def _load_generators() -> None:
    from . import flashattn, kernels, leaderboard, memory, overheads, parallel, profiling, profiling_more  # noqa: F401  (registration by import)


def render(text: str, cache: dict[str, str] | None = None) -> str:
    """``text`` with every generated block rebuilt (multi-line results go on lines of their own)."""
    _load_generators()
    cache = {} if cache is None else cache

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in REGISTRY:
            raise KeyError(f"no generator for block {name!r} (known: {', '.join(sorted(REGISTRY))})")
        if name not in cache:
            cache[name] = REGISTRY[name]().strip("\n")
        body = cache[name]
        if "\n" in body or match["body"].startswith("\n"):
            body = f"\n{body}\n"
        return f"<!-- gen:{name} -->{body}<!-- /gen -->"

    return MARKER.sub(replace, text)


def markdown_files() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def stale_blocks() -> list[str]:
    """``file: block`` for every generated block whose text differs from its regeneration."""
    cache: dict[str, str] = {}
    stale = []
    for path in markdown_files():
        text = path.read_text()
        new = render(text, cache)
        if new == text:
            continue
        old_blocks = {m.start(): m for m in MARKER.finditer(text)}
        new_blocks = list(MARKER.finditer(new))
        for old, fresh in zip(old_blocks.values(), new_blocks, strict=True):
            if old.group(0) != fresh.group(0):
                stale.append(f"{path.relative_to(ROOT)}: {old['name']}")
    return stale


def write_all() -> list[Path]:
    """Rewrite every file whose generated blocks changed (through a temporary name); the changed paths."""
    cache: dict[str, str] = {}
    changed = []
    for path in markdown_files():
        text = path.read_text()
        new = render(text, cache)
        if new != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(new)
            tmp.replace(path)
            changed.append(path)
    return changed
