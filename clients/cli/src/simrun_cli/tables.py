"""Tables and styled text for people, drawn without rich: columns of text padded to their widths.

rich's import would cost a command that prints a table a third of its start (`simrun status` is the one agents
call most). A column that may fold is folded to fit a terminal; on a pipe a table is as wide as its content.
Styles are ANSI codes through click, shown only on a terminal and never with `NO_COLOR` (`echo`). Every cell is
shown with its control characters written out (`simrun_core.text.printable`).
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from simrun_core.text import printable

STATE_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "queued": "blue",
    "submitting": "blue",
    "pending": "dim",
}
"""How each run, task or environment state shows: a color, or dim (the live bars of `--watch` too)."""
BAR_WIDTH = 20
GAP = "  "
FALLBACK_WIDTH = 80
"""The width of a terminal that reports none, as rich and `shutil.get_terminal_size` take it."""


@dataclass(frozen=True)
class Styled:
    """Text and its style, as `click.style` takes it (`fg`, `bold`, `dim`)."""

    text: str
    style: dict[str, Any]

    def __str__(self) -> str:
        return click.style(self.text, **self.style) if self.style else self.text


Cell = str | Styled


@dataclass(frozen=True)
class Column:
    """A table's column: its header, `right` to justify right, `fold` when it may be folded to fit the width."""

    header: str
    right: bool = False
    fold: bool = False


def state(name: str) -> Styled:
    """A run's or task's state in its color (`pending` dim)."""
    style = STATE_STYLES.get(name, "")
    return Styled(name, {"dim": True} if style == "dim" else {"fg": style} if style else {})


def echo(lines: Iterable[str]) -> None:
    """Prints the lines, styled on a terminal (unless `NO_COLOR` is set), plain elsewhere."""
    click.echo("\n".join(lines), color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))


def bar(done: int, total: int) -> Styled:
    """A bar of `BAR_WIDTH` cells, a cell per twentieth done (a half cell per fortieth): green once complete."""
    halves = min(BAR_WIDTH * 2, BAR_WIDTH * 2 * max(0, done) // total) if total > 0 else 0
    filled = "━" * (halves // 2) + ("╸" if halves % 2 else "")
    return Styled(filled.ljust(BAR_WIDTH), {"fg": "green" if halves == BAR_WIDTH * 2 else "magenta"})


def table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    *,
    rule: bool = False,
    rules_after: Collection[int] = (),
    width: int | None = None,
) -> list[str]:
    """The rows under their bold headers, columns two spaces apart; with `rule` a line under the headers, and
    under each row numbered in `rules_after`. Past `width` (the terminal's, or none on a pipe unless `COLUMNS`
    says), the folding columns are narrowed from the widest and their cells folded."""
    limit = width if width is not None else _output_width()
    widths = [max([_widest(_text(c.header)), *(_widest(_text(row[i])) for row in rows)]) for i, c in enumerate(columns)]
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - limit if limit is not None else 0
    for i in sorted((i for i, c in enumerate(columns) if c.fold), key=lambda i: -widths[i]):
        if excess <= 0:
            break
        narrower = max(8, widths[i] - excess)
        excess -= widths[i] - narrower
        widths[i] = narrower
    header = [Styled(c.header, {"bold": True}) for c in columns]
    line_of_rule = "─" * (sum(widths) + len(GAP) * (len(columns) - 1))
    lines: list[str] = []
    for number, row in enumerate([header, *rows], start=-1):
        folded = [_fold(_text(cell), widths[i]) for i, cell in enumerate(row)]
        for line in range(max(len(pieces) for pieces in folded)):
            cells = []
            for i, cell in enumerate(row):
                piece = folded[i][line] if line < len(folded[i]) else ""
                pad = " " * (widths[i] - cell_width(piece))
                shown = str(Styled(piece, cell.style)) if isinstance(cell, Styled) and piece else piece
                cells.append(pad + shown if columns[i].right else shown + pad)
            lines.append(GAP.join(cells).rstrip())
        if (rule and number == -1) or number in rules_after:
            lines.append(line_of_rule)
    return lines


def cell_width(text: str) -> int:
    """Terminal cells `text` takes: two for a wide character (East Asian, most emoji), none for a combining one."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _fold(text: str, width: int) -> list[str]:
    """`text` cut into pieces of at most `width` cells (at its own line ends first)."""
    pieces: list[str] = []
    for line in text.split("\n"):
        piece, used = "", 0
        for c in line:
            w = cell_width(c)
            if used + w > width and piece:
                pieces.append(piece)
                piece, used = "", 0
            piece += c
            used += w
        pieces.append(piece)
    return pieces


def _text(cell: Cell) -> str:
    """A cell's text as shown: its control characters written out (a task or submitter chose most cells, and an
    escape sequence in one must not drive the reader's terminal), its tabs as spaces."""
    return printable(cell.text if isinstance(cell, Styled) else cell).expandtabs(8)


def _widest(text: str) -> int:
    return max(cell_width(line) for line in text.split("\n"))


def _output_width() -> int | None:
    """`COLUMNS`, else the terminal's width; on a pipe none (a table as wide as its content)."""
    asked = os.environ.get("COLUMNS", "")
    if asked.isdigit() and int(asked) > 0:
        return int(asked)
    if not sys.stdout.isatty():
        return None
    try:
        columns = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):  # no descriptor (a test's captured output)
        return None
    return columns or FALLBACK_WIDTH  # a terminal that says no size (a pseudo-terminal nobody sized)
