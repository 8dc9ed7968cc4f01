"""Where a client finds this machine's simrun: the default endpoint, the home folder and the owner's token.

Plain standard library (no pydantic), so that `simrun status` and other clients start quickly;
`simrun_core.config` re-exports these names.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 50551
DEFAULT_ENDPOINT = f"127.0.0.1:{DEFAULT_PORT}"


def simrun_home() -> Path:
    """The folder of this machine's embedded server: `$SIMRUN_HOME`, else `~/.simrun`."""
    return Path(os.environ.get("SIMRUN_HOME") or Path.home() / ".simrun").expanduser()


def client_token(explicit: str | None) -> str | None:
    """The token a client sends: the explicit one, else `$SIMRUN_TOKEN`, else the home's `token` file."""
    if explicit:
        return explicit
    if env := os.environ.get("SIMRUN_TOKEN"):
        return env
    token_file = simrun_home() / "token"
    return token_file.read_text().strip() if token_file.exists() else None
