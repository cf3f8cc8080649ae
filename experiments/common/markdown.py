"""The one markdown table renderer: every summary.md and paper table is written by :func:`md_table`."""

from __future__ import annotations


def md_cell(value) -> str:
    """A cell's text kept inside its cell: ``|`` escaped, line breaks as spaces."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def num(x, nd: int = 3, none: str = "–") -> str:
    """A number with ``nd`` decimals; ``none`` for a missing value or NaN."""
    return none if x is None or x != x else f"{x:.{nd}f}"


def pct(x, nd: int = 1, none: str = "–") -> str:
    """A share as a percentage with ``nd`` decimals (0.163 -> '16.3 %'); ``none`` for a missing value or NaN."""
    return none if x is None or x != x else f"{100 * x:.{nd}f} %"


def md_table(columns, rows) -> list[str]:
    """A markdown table's lines: the header, the ``| --- |`` rule, one line per row (each cell as ``str``)."""
    line = lambda cells: "| " + " | ".join(map(str, cells)) + " |"  # noqa: E731
    return [line(columns), "|" + " --- |" * len(columns), *map(line, rows)]
