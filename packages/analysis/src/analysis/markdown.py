"""Markdown pieces of the report: sympy expressions in LaTeX, and tables (pandas, through the harness)."""

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
    """A GitHub Markdown table (through pandas); cells are converted with ``str`` (``|`` escaped) and kept
    as written (no number parsing)."""
    import pandas as pd
    from harness.results import to_markdown

    if any(len(row) != len(headers) for row in rows):
        raise ValueError(f"every row needs {len(headers)} cells")
    cells = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
    return to_markdown(pd.DataFrame(cells, columns=headers), disable_numparse=True)
