"""Markdown tables for the sweep report and the benchmark page."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured table; a `|` inside a cell becomes `/` so it cannot split the cell."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)
