"""How every client says a run's facts: its JSON, who submitted it, a compared value. Light (no grpc), so the
CLI's quick read commands use it too."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from simrun.v1 import common_pb2, tracker_pb2


def run_json(run: common_pb2.Run, files: Iterable[tracker_pb2.OutputFile]) -> dict[str, Any]:
    """The run as `simrun status --json` prints it: the API's JSON, each task with `outputs`, its ports' folders in
    the store (relative to the store root), from the run's output `files`."""
    from google.protobuf.json_format import MessageToDict  # only here: the CLI's tables start without it

    data = MessageToDict(run, preserving_proto_field_name=True)
    ports: dict[str, dict[str, str]] = {}
    for file in files:
        ports.setdefault(file.task_id, {})[file.port] = file.store_path.removesuffix(file.path).rstrip("/")
    for task in data.get("tasks", []):
        if task["task_id"] in ports:
            task["outputs"] = ports[task["task_id"]]
    return data


def who(identity: common_pb2.Identity) -> str:
    """The identity's name, an agent's with the person it acts for; empty when unnamed."""
    if not identity.name:
        return ""
    return f"{identity.name} (agent of {identity.on_behalf_of})" if identity.on_behalf_of else identity.name


def summary_value(text: str) -> str:
    """A compared value (JSON) for people: numbers compact, strings unquoted, a missing value as `-`."""
    if not text:
        return "-"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)
