"""Output formats shared by the listing commands: ``-o table|wide|json|yaml``.

``table`` is for people (aligned columns, the fewest that tell the story), ``wide`` adds the
columns a table leaves out, ``json`` and ``yaml`` print the whole document for scripts, in the
shape of the admin API or the command's own ``to_json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import click
import yaml

Format = Literal["table", "wide", "json", "yaml"]
FORMATS: tuple[Format, ...] = ("table", "wide", "json", "yaml")

F = TypeVar("F", bound=Callable[..., Any])


def output_option(function: F) -> F:
    """The ``-o/--output`` option (value: one of :data:`FORMATS`, default ``table``), given
    to the command as ``output``."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table (for people), wide (more columns), json or yaml (the whole document).",
    )(function)


def structured(document: Any, output: Format) -> str:
    """``document`` (JSON-ready) as indented JSON, or as YAML in the same key order.

    Raises:
        ValueError: ``output`` is neither ``json`` nor ``yaml``.
    """
    if output == "json":
        return json.dumps(document, indent=2, ensure_ascii=False)
    if output == "yaml":
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).rstrip("\n")
    raise ValueError(f"not a structured format: {output!r}")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], empty: str = "(none)") -> str:
    """Rows as left-aligned columns under ``header``; ``None`` shows as ``-``; ``empty``
    alone when there are no rows. Trailing blanks are cut from every line."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(title)] + [len(row[i]) for row in cells]) for i, title in enumerate(header)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    if not rows:
        lines.append(empty)
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
