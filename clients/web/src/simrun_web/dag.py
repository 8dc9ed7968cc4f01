"""A run's tasks laid out as the graph they form: a column per depth (the longest chain of inputs before a task),
a box per task in its column in the workflow's order, an edge from each task to each task reading its outputs.

The run page draws it as SVG from the server, so it needs no script and shows before any live update.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BOX_HEIGHT = 44
COLUMN_GAP = 56
ROW_GAP = 16
MARGIN = 4
CHAR_WIDTH = 7.5
"""About what one character of the page's font takes at the box's size: a box is as wide as its longest name."""
MAX_NAME = 28
"""Characters of a task's name a box shows; a longer one is cut with an ellipsis (its title holds it whole)."""


@dataclass(frozen=True)
class Box:
    task_id: str
    state: str
    label: str
    x: float
    y: float
    width: float
    height: float = BOX_HEIGHT


@dataclass(frozen=True)
class Edge:
    """From a task to one that reads its outputs: a curve from the right of one box to the left of the other."""

    source: str
    target: str
    path: str


@dataclass(frozen=True)
class Graph:
    boxes: list[Box]
    edges: list[Edge]
    width: float
    height: float


def layout(tasks: Sequence[tuple[str, str, Mapping[str, str]]]) -> Graph:
    """The graph of `tasks`, each (task id, state, inputs: port -> `<task>.<port>`), in the workflow's order. An
    input naming no task of the run (a snapshot's files) draws no edge."""
    ids = [task_id for task_id, _, _ in tasks]
    known = set(ids)
    upstream = {
        task_id: list(dict.fromkeys(ref.split(".", 1)[0] for ref in inputs.values() if ref.split(".", 1)[0] in known))
        for task_id, _, inputs in tasks
    }
    depth = _depths(ids, upstream)
    columns: dict[int, list[str]] = {}
    for task_id in ids:
        columns.setdefault(depth[task_id], []).append(task_id)
    labels = {task_id: task_id if len(task_id) <= MAX_NAME else task_id[: MAX_NAME - 1] + "…" for task_id in ids}
    states = {task_id: state for task_id, state, _ in tasks}
    widths = {
        column: max(96.0, *(CHAR_WIDTH * max(len(labels[t]), len(states[t])) + 20 for t in members))
        for column, members in columns.items()
    }
    tallest = max((len(members) for members in columns.values()), default=0)
    height = MARGIN * 2 + tallest * BOX_HEIGHT + max(tallest - 1, 0) * ROW_GAP
    boxes: dict[str, Box] = {}
    x = float(MARGIN)
    for column in sorted(columns):
        members = columns[column]
        span = len(members) * BOX_HEIGHT + (len(members) - 1) * ROW_GAP
        y = (height - span) / 2  # a column centred beside the tallest
        for task_id in members:
            boxes[task_id] = Box(task_id, states[task_id], labels[task_id], x, y, widths[column])
            y += BOX_HEIGHT + ROW_GAP
        x += widths[column] + COLUMN_GAP
    edges = []
    for task_id in ids:
        target = boxes[task_id]
        for source_id in upstream[task_id]:
            source = boxes[source_id]
            x1, y1 = source.x + source.width, source.y + BOX_HEIGHT / 2
            x2, y2 = target.x, target.y + BOX_HEIGHT / 2
            bend = (x2 - x1) / 2
            path = f"M{x1:g},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2 - 4:g},{y2:g}"
            edges.append(Edge(source_id, task_id, path))
    width = x - COLUMN_GAP + MARGIN if boxes else 0.0
    return Graph(list(boxes.values()), edges, width, float(height))


def _depths(ids: list[str], upstream: dict[str, list[str]]) -> dict[str, int]:
    """Each task's longest chain of inputs, read in the order the inputs allow (without recursion: a server may take
    workflows of thousands of tasks). Tasks on a cycle, which submission refuses, stand after the rest."""
    waiting = {task_id: len(upstream[task_id]) for task_id in ids}
    readers: dict[str, list[str]] = {task_id: [] for task_id in ids}
    for task_id in ids:
        for source in upstream[task_id]:
            readers[source].append(task_id)
    depth = dict.fromkeys(ids, 0)
    ready = [task_id for task_id in ids if waiting[task_id] == 0]
    while ready:
        task_id = ready.pop()
        for reader in readers[task_id]:
            depth[reader] = max(depth[reader], depth[task_id] + 1)
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    last = max(depth.values(), default=0) + 1
    return {task_id: depth[task_id] if waiting[task_id] == 0 else last for task_id in ids}
