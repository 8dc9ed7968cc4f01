"""How the CLI shows simrun's messages to people: tables, a run's view, live progress bars (programs get
`simrun_cli.plain`).

The tables are drawn without rich (`simrun_cli.tables`), so that a command that prints one starts without it;
only following a run (`--watch`) draws rich's live bars, imported then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from simrun.v1 import common_pb2
from simrun_client.reading import summary_value, who
from simrun_core.text import printable

from simrun_cli.plain import run_state, size, task_state, when
from simrun_cli.tables import Cell, Column, Styled, bar, echo, state, table

if TYPE_CHECKING:
    from rich.console import Console
    from simrun.v1 import tracker_pb2


def console() -> Console:
    """The console `submit`'s lines and a followed run's live bars draw on: no markup, emoji codes or
    highlighting, so that what simrun prints (a task's name, a message) shows as it is; styles come from `Text`."""
    from rich.console import Console

    # Made per command so it writes to the sys.stdout of the moment (click's test runner swaps it). Piped output
    # is as wide as its lines need, unless COLUMNS says otherwise.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(highlight=False, markup=False, emoji=False, width=width)


PIPE_WIDTH = 10_000
"""Columns of output that goes to a pipe or file."""


def units_bar(units: int | None, done: int, state: str) -> tuple[int, int]:
    """(total, completed) of a task's bar: its units if split, else 1, complete once it succeeded."""
    if units is not None:
        return units, done
    return 1, 1 if state == "succeeded" else 0


def show(run: common_pb2.Run, comparison: tracker_pb2.CompareRunsResponse | None) -> None:
    """Prints the run: its header, its tasks' table and messages and, given its comparison, its summaries."""
    lines = list(run_header(run))
    if run.tasks:
        lines += tasks_table(run)
    lines += task_messages(run)
    if comparison is not None:
        lines += summaries_table(comparison)
    echo(lines)


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
        total, done = units_bar(units, task.units_done, name)
        rows.append(
            [
                task.task_id,
                task.type,
                state(name),
                bar(done, total),
                f"{task.units_done}/{units}" if units is not None else "-",
                _pods(task, name),
            ]
        )
    return table(columns, rows)


def _pods(task: common_pb2.Task, state_name: str) -> str:
    """The pods a task planned while it waits, then those that started: a task cancelled before it ran shows 0."""
    if state_name in ("pending", "queued") and not task.pods_started:
        return str(task.plan.pods) if task.plan.pods else ""
    return str(task.pods_started)


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
        [row.task_id, row.key, summary_value(row.values[0] if row.values else "")] for row in comparison.rows
    ]
    return [
        str(Styled("summaries", {"bold": True})),
        *table([Column("task"), Column("key"), Column("value", fold=True)], rows),
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def comparison_table(
    comparison: tracker_pb2.CompareRunsResponse, settings: Sequence[tuple[str, str, Sequence[str]]] = ()
) -> list[str]:
    """Summary values side by side: a row per task and key, a column per run; first what each run ran on (its
    model, snapshot and commit), then the differing settings, dim; a line below says when the runs are of several
    models."""
    columns = [Column("task"), Column("key"), *(Column(run_id, right=True) for run_id in comparison.run_ids)]
    dim = {"dim": True}
    rows: list[list[Cell]] = [
        ["run", row.key, *(_source_value(row.key, v) for v in row.values)] for row in comparison.sources
    ]
    rules = {len(rows) - 1} if rows else set()
    rows += [
        [Styled(text, dim) for text in (task_id, f"settings.{key}", *map(summary_value, values))]
        for task_id, key, values in settings
    ]
    if settings:
        rules.add(len(rows) - 1)
    rows += [[row.task_id, row.key, *(summary_value(v) for v in row.values)] for row in comparison.rows]
    lines = table(columns, rows, rule=True, rules_after=rules)
    models: Sequence[str] = next((row.values for row in comparison.sources if row.key == "model"), [])
    distinct = list(dict.fromkeys(summary_value(v) for v in models if v))
    if len(distinct) > 1:
        names = printable(", ".join(distinct))
        lines.append(f"these runs are of {len(distinct)} models ({names}): their values are not one study")
    return lines


def _source_value(key: str, value: str) -> str:
    """A source row's value: a commit as its first 12 characters, as git shows one."""
    shown = summary_value(value)
    return shown[:12] if key == "commit" else shown


def runs_table(runs: Iterable[common_pb2.Run]) -> list[str]:
    columns = [Column(name) for name in ("run", "state", "group", "submitted by", "tasks done", "submitted")]
    rows: list[list[Cell]] = []
    for run in runs:
        done = sum(task.state == common_pb2.TASK_STATE_SUCCEEDED for task in run.tasks)
        rows.append(
            [
                run.run_id,
                state(run_state(run.state)),
                run.group,
                who(run.identity),
                f"{done}/{len(run.tasks)}",
                when(run.create_time),
            ]
        )
    return table(columns, rows, rule=True)


def estimate_table(estimate: tracker_pb2.EstimateRunResponse) -> list[str]:
    columns = [
        Column("task"),
        Column("pods", right=True),
        Column("processes × cores", right=True),
        Column("memory GiB", right=True),
        Column("units", right=True),
        Column("priority"),
        Column("memory from"),
        Column("compute seconds", right=True),  # learned seconds over its processes; 0 reused; `unknown` until learned
        Column("reused from"),
    ]
    rows: list[list[Cell]] = []
    for task in estimate.tasks:
        shape = task.plan.shape
        rows.append(
            [
                task.task_id,
                str(task.plan.pods),
                f"{shape.processes} × {shape.cores // max(shape.processes, 1)}",
                str(shape.memory_gb),
                str(task.plan.units) if task.plan.HasField("units") else "-",
                task.plan.base_priority.removeprefix("simrun-"),
                common_pb2.ResolutionRule.Name(task.resources.rule).removeprefix("RESOLUTION_RULE_").lower(),
                _seconds(task.seconds) if task.HasField("seconds") else "unknown",
                _reused(task.reused_from) if task.HasField("reused_from") else "",
            ]
        )
    unknown = [t.task_id for t in estimate.tasks if not t.HasField("seconds")]
    if unknown:
        total = f"compute seconds in all: unknown until {', '.join(unknown)} ran once"
    else:
        total = f"compute seconds in all: {_seconds(sum(t.seconds for t in estimate.tasks))} (a reused task's are 0)"
    return [*table(columns, rows, rule=True), total]


def _reused(source: common_pb2.ReusedFrom) -> str:
    units = f"{source.units} units of " if source.HasField("units") else ""
    return f"{units}{source.run_id} {source.task_id}"


def _seconds(seconds: float) -> str:
    """Seconds for people: two significant digits below ten, so that 0.04 s does not read 0.0."""
    return f"{seconds:.2g}" if seconds < 10 else f"{seconds:.0f}"


def outputs_table(files: Iterable[tracker_pb2.OutputFile]) -> list[str]:
    """One row per output file: task, port, path in the port, size, path in the store."""
    columns = [Column("task"), Column("port"), Column("file"), Column("size", right=True), Column("in the store")]
    rows: list[list[Cell]] = [
        [file.task_id, file.port, file.path, size(file.size_bytes), file.store_path] for file in files
    ]
    return table(columns, rows, rule=True)


def nodes_table(nodes: Iterable[common_pb2.Node]) -> list[str]:
    columns = [Column("node"), *(Column(n, right=True) for n in ("cores", "memory GiB", "gpus")), Column("reserved by")]
    rows: list[list[Cell]] = [
        [node.name, str(node.cores), f"{node.memory_gb:g}", str(node.gpus), node.reserved_by or ""] for node in nodes
    ]
    return table(columns, rows, rule=True)


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
            total, done = units_bar(units, task.units_done, state)
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


def environments_table(environments: Iterable[common_pb2.Environment]) -> list[str]:
    """One row per environment: id, state, Python, packages, size, last used, and its image by digest when the
    builder makes images (the size is then the image's in the registry)."""
    environments = list(environments)
    images = any(env.image for env in environments)
    names = ("environment", "state", "python", "packages", "size", "last used", *(("image",) if images else ()))
    columns = [Column(name) for name in names]
    rows: list[list[Cell]] = []
    for env in environments:
        last = when(env.last_use_time) if env.HasField("last_use_time") else ""
        rows.append(
            [
                env.environment_id,
                _ENVIRONMENT_STATES.get(env.state, "?"),
                env.python_version,
                str(env.package_count),
                size(env.size_bytes) if env.size_bytes else "",
                last,
                *((env.image,) if images else ()),
            ]
        )
    return table(columns, rows)
