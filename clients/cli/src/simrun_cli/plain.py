"""What the CLI prints without rich: the API's JSON for programs, and simrun's values in words for one-line answers.

`simrun status --json`, `simrun whoami` or `simrun cancel` print through this module alone, so they start without
rich (the tables and progress bars of `simrun_cli.render` are what cost a command most of its start after grpc).
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import TYPE_CHECKING, Any

import click
from simrun.v1 import common_pb2

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from google.protobuf.timestamp_pb2 import Timestamp


def echo_json(message: Message | dict[str, Any]) -> None:
    """Prints a message as the API's JSON (proto field names), or a dict of them as is."""
    data = message if isinstance(message, dict) else to_dict(message)
    click.echo(json.dumps(data, indent=2))


def to_dict(message: Message) -> dict[str, Any]:
    """The message as the API's JSON object, with the proto's field names."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True)


def run_state(value: common_pb2.RunState.ValueType) -> str:
    """`succeeded` for RUN_STATE_SUCCEEDED."""
    return common_pb2.RunState.Name(value).removeprefix("RUN_STATE_").lower()


def task_state(value: common_pb2.TaskState.ValueType) -> str:
    """`running` for TASK_STATE_RUNNING."""
    return common_pb2.TaskState.Name(value).removeprefix("TASK_STATE_").lower()


def priority(value: common_pb2.Priority.ValueType) -> str:
    """`normal` for PRIORITY_NORMAL."""
    return common_pb2.Priority.Name(value).removeprefix("PRIORITY_").lower()


def when(timestamp: Timestamp) -> str:
    """A timestamp in local time to the second; empty when unset."""
    if not timestamp.seconds and not timestamp.nanos:
        return ""
    return timestamp.ToDatetime(tzinfo=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def size(size_bytes: int) -> str:
    """Bytes for people: B, KiB, MiB, GiB."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
