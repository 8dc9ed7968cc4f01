"""How every client says a run's facts to people: who submitted it, and a compared value. Light (no grpc), so
the CLI's quick read commands use it too."""

from __future__ import annotations

import json

from simrun.v1 import common_pb2


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
