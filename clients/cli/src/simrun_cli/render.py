"""How the CLI shows simrun's messages to people: rich tables and progress bars (programs get `simrun_cli.plain`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from simrun.v1 import common_pb2
from simrun_core.text import printable

from simrun_cli.plain import run_state, size, task_state, when, who
from simrun_cli.run_view import STATE_STYLES, summary_value

if TYPE_CHECKING:
    from simrun.v1 import tracker_pb2


def console() -> Console:
    """The console a command draws on: no markup, emoji codes or highlighting, so that what simrun prints (a task's
    name, message or summary value) shows as it is; styles come from `Text` alone. (Emoji codes would also load
    rich's table of them, a tenth of the start of `simrun status`.)"""
    # Made per command so it writes to the sys.stdout of the moment (click's test runner swaps it). Piped output
    # is as wide as its tables need (no column cut to `…`), unless COLUMNS says otherwise.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(highlight=False, markup=False, emoji=False, width=width)


PIPE_WIDTH = 10_000
"""Columns of output that goes to a pipe or file: rich then sizes each table to its content."""


def styled(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def _units(units: int | None, done: int, state: str) -> tuple[int, int]:
    """(total, completed) of a bar: a split task's units, or 1 for an unsplit task, complete once it succeeded."""
    if units is not None:
        return units, done
    return 1, 1 if state == "succeeded" else 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def comparison_table(
    comparison: tracker_pb2.CompareRunsResponse, settings: Sequence[tuple[str, str, Sequence[str]]] = ()
) -> Table:
    """Summary values side by side: a row per task and key, a column per run; the differing settings first."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("task", no_wrap=True)
    table.add_column("key", no_wrap=True)
    for run_id in comparison.run_ids:
        table.add_column(run_id, no_wrap=True, justify="right")
    # A task chose its summaries' keys and values: an escape sequence in one must not drive the reader's terminal.
    for task_id, key, values in settings:
        table.add_row(task_id, printable(f"settings.{key}"), *(summary_value(v) for v in values), style="dim")
    if settings:
        table.add_section()
    for row in comparison.rows:
        table.add_row(printable(row.task_id), printable(row.key), *(summary_value(v) for v in row.values))
    return table


def runs_table(runs: Iterable[common_pb2.Run]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("run", "state", "group", "submitted by", "tasks done", "submitted"):
        table.add_column(name, no_wrap=name in ("run", "submitted"))
    for run in runs:
        done = sum(task.state == common_pb2.TASK_STATE_SUCCEEDED for task in run.tasks)
        table.add_row(
            run.run_id,
            styled(run_state(run.state)),
            run.group,
            who(run.identity),
            f"{done}/{len(run.tasks)}",
            when(run.create_time),
        )
    return table


def estimate_table(estimate: tracker_pb2.EstimateRunResponse) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (
        ("task", "left"),
        ("pods", "right"),
        ("processes × cores", "right"),
        ("memory GiB", "right"),
        ("units", "right"),
        ("priority", "left"),
        ("memory from", "left"),
        ("compute seconds", "right"),  # its units' learned seconds over its processes; `unknown` until learned
        ("reused from", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=name == "task")  # type: ignore[arg-type]
    for task in estimate.tasks:
        shape = task.plan.shape
        table.add_row(
            task.task_id,
            str(task.plan.pods),
            f"{shape.processes} × {shape.cores // max(shape.processes, 1)}",
            str(shape.memory_gb),
            str(task.plan.units) if task.plan.HasField("units") else "-",
            task.plan.base_priority.removeprefix("simrun-"),
            common_pb2.ResolutionRule.Name(task.resources.rule).removeprefix("RESOLUTION_RULE_").lower(),
            _seconds(task.seconds) if task.HasField("seconds") else "unknown",
            _reused(task.reused_from) if task.HasField("reused_from") else "",
        )
    return table


def _reused(source: common_pb2.ReusedFrom) -> str:
    units = f"{source.units} units of " if source.HasField("units") else ""
    return f"{units}{source.run_id} {source.task_id}"


def _seconds(seconds: float) -> str:
    """Seconds for people: two significant digits below ten, so that 0.04 s does not read 0.0."""
    return f"{seconds:.2g}" if seconds < 10 else f"{seconds:.0f}"


def outputs_table(files: Iterable[tracker_pb2.OutputFile]) -> Table:
    """One row per output file: task, port, path in the port, size, path in the store."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (
        ("task", "left"),
        ("port", "left"),
        ("file", "left"),
        ("size", "right"),
        ("in the store", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for file in files:
        # The task named its files: never let a name drive the terminal.
        table.add_row(file.task_id, file.port, printable(file.path), size(file.size_bytes), printable(file.store_path))
    return table


def nodes_table(nodes: Iterable[common_pb2.Node]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("node", "cores", "memory GiB", "gpus", "reserved by"):
        table.add_column(name, justify="left" if name in ("node", "reserved by") else "right")
    for node in nodes:
        table.add_row(node.name, str(node.cores), f"{node.memory_gb:g}", str(node.gpus), node.reserved_by or "")
    return table


class RunProgress:
    """A live progress bar per task of a run, fed by the WatchRun stream; off a terminal, a line per change.

    Rich draws no live display when the output is not a terminal, so a pipe or a log file would see nothing
    until the run ends; there each change of a task (its state or its units done) is one line instead.
    """

    def __init__(self, out: Console) -> None:
        # Imported here: only a followed run draws bars.
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._out = out
        self._live = out.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}", style="bold"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
            console=out,
        )
        self._bars: dict[str, Any] = {}  # task id -> rich's TaskID
        self._seen: dict[str, tuple[str, int, int | None]] = {}

    def __enter__(self) -> RunProgress:
        if self._live:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._progress.stop()

    def update(self, progress: Iterable[tracker_pb2.TaskProgress]) -> None:
        for task in progress:
            state = task_state(task.state)
            units = task.units if task.HasField("units") else None
            if not self._live:
                self._line(task.task_id, state, task.units_done, units)
                continue
            total, done = _units(units, task.units_done, state)
            bar = self._bars.get(task.task_id)
            if bar is None:
                bar = self._bars[task.task_id] = self._progress.add_task(task.task_id, total=total, state="")
            self._progress.update(bar, total=total, completed=done, state=state)

    def _line(self, task_id: str, state: str, done: int, units: int | None) -> None:
        if self._seen.get(task_id) == (state, done, units):
            return
        self._seen[task_id] = (state, done, units)
        now = datetime.now().astimezone().strftime("%H:%M:%S")
        counted = f" {done}/{units} units" if units is not None else ""
        self._out.print(f"{now} {task_id} {state}{counted}", soft_wrap=True)


_ENVIRONMENT_STATES = {
    common_pb2.ENVIRONMENT_STATE_BUILDING: "building",
    common_pb2.ENVIRONMENT_STATE_READY: "ready",
    common_pb2.ENVIRONMENT_STATE_FAILED: "failed",
}


def environments_table(environments: Iterable[common_pb2.Environment]) -> Table:
    """One row per environment: id, state, Python, packages, size, last used."""
    table = Table(box=None, pad_edge=False)
    for column in ("environment", "state", "python", "packages", "size", "last used"):
        table.add_column(column, no_wrap=True)
    for env in environments:
        last = when(env.last_use_time) if env.HasField("last_use_time") else ""
        table.add_row(
            env.environment_id,
            _ENVIRONMENT_STATES.get(env.state, "?"),
            env.python_version,
            str(env.package_count),
            size(env.size_bytes) if env.size_bytes else "",
            last,
        )
    return table
