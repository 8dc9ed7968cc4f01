"""The rules a snapshot's name and id follow in a request, checked before either becomes a path."""

from __future__ import annotations

import re

from simrun_core.errors import InvalidArgument

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SNAPSHOT_ID = re.compile(r"[0-9a-f]{32}")


def check_snapshot_name(name: str, snapshot_id: str) -> None:
    """Refuses a name or id that is not a snapshot's, so no request names a path out of the store."""
    if not _NAME.fullmatch(name or ""):
        raise InvalidArgument(f"bad snapshot name {name!r}: letters, digits, '.', '_' or '-'")
    if not _SNAPSHOT_ID.fullmatch(snapshot_id or ""):
        raise InvalidArgument(f"bad snapshot_id {snapshot_id!r}: expected 32 lowercase hex digits")
