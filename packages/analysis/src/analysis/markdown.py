"""Small Markdown helpers for the report: tables and sympy expressions in LaTeX."""

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
    """A GitHub Markdown table; cells are converted with ``str`` (``|`` escaped)."""
    if any(len(row) != len(headers) for row in rows):
        raise ValueError(f"every row needs {len(headers)} cells")

    def line(cells) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(headers), line(["---"] * len(headers)), *(line(row) for row in rows)])
