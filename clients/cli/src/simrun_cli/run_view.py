"""How `simrun status` shows a run to people: its header, its tasks with their bars, their messages and summaries.

Drawn without rich, whose import would cost `simrun status` a third of its start: the tables here are columns of
text padded to their widths (a column that may fold is folded to fit a terminal), styles are ANSI codes through
click, shown only on a terminal (and never with `NO_COLOR`). The other commands' tables are rich's
(`simrun_cli.render`).
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from simrun.v1 import common_pb2
from simrun_core.text import printable

from simrun_cli.plain import run_state, task_state, when, who

if TYPE_CHECKING:
    from simrun.v1 import tracker_pb2

STATE_STYLES = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "queued": "blue",
    "submitting": "blue",
    "pending": "dim",
}
"""How each run or task state shows, here and in rich's tables: a color, or dim."""
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


def show(run: common_pb2.Run, comparison: tracker_pb2.CompareRunsResponse | None) -> None:
    """Prints the run: its header, its tasks' table and messages and, given its comparison, its summaries."""
    lines = list(run_header(run))
    if run.tasks:
        lines += tasks_table(run)
    lines += task_messages(run)
    if comparison is not None:
        lines += summaries_table(comparison)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    click.echo("\n".join(lines), color=color)


def run_header(run: common_pb2.Run) -> Iterator[str]:
    """The run's id, state, group, submitter, times, model and message."""
    yield f"{Styled('run ' + run.run_id, {'bold': True})}  {state(run_state(run.state))}"
    submitted = f"submitted by {who(run.identity) or '?'} at {when(run.create_time)}"
    yield f"group {printable(run.group or 'default')}, {submitted}"
    if run.HasField("end_time"):
        yield f"ended at {when(run.end_time)}"
    if run.snapshots:
        model = run.snapshots[0]
        source = model.provenance
        origin = ", ".join(
            part
            for part in (
                f"branch {printable(source.branch)}" if source.branch else "",
                f"commit {source.commit[:10]}" if source.commit else "",
                _count(len(source.changed_files), "changed file") if source.dirty else "",
            )
            if part
        )
        yield f"model {printable(model.name)} {model.snapshot_id[:12]}" + (f" ({origin})" if origin else "")
    if run.environment:
        yield f"environment {run.environment}"
    if run.reservation:
        yield f"reserves node {printable(run.reservation)}"
    if run.trace_id:
        yield str(Styled(f"trace {run.trace_id}", {"dim": True}))
    if run.message:
        color = "red" if run.state == common_pb2.RUN_STATE_FAILED else "yellow"
        yield str(Styled(printable(run.message), {"fg": color}))


def tasks_table(run: common_pb2.Run) -> list[str]:
    """One row per task: its type, state, a bar of its units, its pods."""
    columns = [Column("task"), Column("type", fold=True), Column("state"), Column("progress")]
    columns += [Column("units", right=True), Column("pods", right=True)]
    rows: list[list[Cell]] = []
    for task in run.tasks:
        name = task_state(task.state)
        units = task.units if task.HasField("units") else None
        total, done = (units, task.units_done) if units is not None else (1, 1 if name == "succeeded" else 0)
        rows.append(
            [
                printable(task.task_id),
                printable(task.type),
                state(name),
                bar(done, total),
                f"{task.units_done}/{units}" if units is not None else "-",
                str(task.plan.pods) if task.plan.pods else "",
            ]
        )
    return table(columns, rows)


def task_messages(run: common_pb2.Run) -> Iterator[str]:
    """A line for each task reused from an earlier run or with a message (a failure's, say)."""
    for task in run.tasks:
        if task.HasField("reused_from"):
            source = task.reused_from
            what = f"{source.units} units" if source.HasField("units") else "outputs"
            line = f"{task.task_id}: {what} reused from run {source.run_id} task {source.task_id}"
            yield str(Styled(printable(line), {"fg": "green"}))
        elif task.message:
            yield str(Styled(f"{printable(task.task_id)}: {printable(task.message)}", {"fg": "red"}))


def summaries_table(comparison: tracker_pb2.CompareRunsResponse) -> list[str]:
    """One run's task summaries under a title: task, key, value."""
    rows: list[list[Cell]] = [
        [printable(row.task_id), printable(row.key), summary_value(row.values[0] if row.values else "")]
        for row in comparison.rows
    ]
    return [
        str(Styled("summaries", {"bold": True})),
        *table([Column("task"), Column("key"), Column("value", fold=True)], rows),
    ]


def summary_value(text: str) -> str:
    """A summary value (JSON) for people: numbers compact, strings unquoted (their control characters written
    out, see `printable`), a missing value as `-`."""
    if not text:
        return "-"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return printable(text)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return printable(value)
    return json.dumps(value)


def bar(done: int, total: int) -> Styled:
    """A bar of `BAR_WIDTH` cells, a cell per twentieth done (a half cell per fortieth): green once complete."""
    halves = min(BAR_WIDTH * 2, BAR_WIDTH * 2 * max(0, done) // total) if total > 0 else 0
    filled = "━" * (halves // 2) + ("╸" if halves % 2 else "")
    return Styled(filled.ljust(BAR_WIDTH), {"fg": "green" if halves == BAR_WIDTH * 2 else "magenta"})


def table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None = None) -> list[str]:
    """The rows under their bold headers, columns two spaces apart; past `width` (the terminal's, or none on a
    pipe unless `COLUMNS` says), the folding columns are narrowed from the widest and their cells folded."""
    limit = width if width is not None else _output_width()
    widths = [max([cell_width(c.header), *(_widest(_text(row[i])) for row in rows)]) for i, c in enumerate(columns)]
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - limit if limit is not None else 0
    for i in sorted((i for i, c in enumerate(columns) if c.fold), key=lambda i: -widths[i]):
        if excess <= 0:
            break
        narrower = max(8, widths[i] - excess)
        excess -= widths[i] - narrower
        widths[i] = narrower
    header = [Styled(c.header, {"bold": True}) for c in columns]
    lines: list[str] = []
    for row in [header, *rows]:
        folded = [_fold(_text(cell), widths[i]) for i, cell in enumerate(row)]
        for line in range(max(len(pieces) for pieces in folded)):
            cells = []
            for i, cell in enumerate(row):
                piece = folded[i][line] if line < len(folded[i]) else ""
                pad = " " * (widths[i] - cell_width(piece))
                shown = str(Styled(piece, cell.style)) if isinstance(cell, Styled) and piece else piece
                cells.append(pad + shown if columns[i].right else shown + pad)
            lines.append(GAP.join(cells).rstrip())
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
    return (cell.text if isinstance(cell, Styled) else cell).expandtabs(8)


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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
