"""What runs differ in, as submitted: the one reading of a comparison's settings for every client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from simrun.v1 import common_pb2
from simrun_core.errors import SimrunError


def differing_settings(runs: list[common_pb2.Run]) -> list[tuple[str, str, list[str]]]:
    """The settings (task, dotted key, JSON value per run) that differ between runs, as submitted."""
    from simrun_core.workflow import parse_workflow

    per_run: list[dict[tuple[str, str], str]] = []
    for run in runs:
        values: dict[tuple[str, str], str] = {}
        try:
            tasks = parse_workflow(run.workflow).spec.tasks if run.workflow else {}
        except SimrunError:
            tasks = {}
        for task_id, task in tasks.items():
            for key, value in _flatten(task.settings):
                values[task_id, key] = json.dumps(value, sort_keys=True)
        per_run.append(values)
    keys = sorted({key for values in per_run for key in values})
    rows = [(task, key, [values.get((task, key), "") for values in per_run]) for task, key in keys]
    return [row for row in rows if len(set(row[2])) > 1]


def _flatten(settings: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
