"""Markdown pieces of the report: sympy expressions in LaTeX, and tables."""

from __future__ import annotations

import sympy as sp

from .ffn_parallel import F

SYMBOL_NAMES = {F: "D_{FF}"}


def latex(expr: sp.Expr) -> str:
    """``sympy.latex`` with the project's symbol names (``F`` printed as ``D_{FF}``), without ``$``."""
    return sp.latex(expr, symbol_names=SYMBOL_NAMES)


def math_cell(expr: sp.Expr) -> str:
    """Inline math: ``$latex$``."""
    return f"${latex(expr)}$"


def md_table(headers: list[str], rows: list[list]) -> str:
    """A compact GitHub Markdown table (``| a | b |`` rows under ``| --- | --- |``); cells are converted
    with ``str`` (``|`` escaped) and kept as written (no number parsing, no padding)."""
    if any(len(row) != len(headers) for row in rows):
        raise ValueError(f"every row needs {len(headers)} cells")
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    return "\n".join("| " + " | ".join(row) + " |" for row in [headers, ["---"] * len(headers), *cells])


def generated(name: str, multiline: bool = False) -> str:
    """A block of ``docs/*.md`` that ``python -m docs.tables`` fills from the raw files it names: the
    report marks where it goes (the measurements are not inputs of the analysis)."""
    body = "(filled in by `python -m docs.tables` from the measurement files)"
    body = f"\n{body}\n" if multiline else body
    return f"<!-- gen:{name} -->{body}<!-- /gen -->"
