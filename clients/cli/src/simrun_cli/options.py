"""The options every command shares: where simrun is (--endpoint), who calls (--token), --json."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
from simrun_client.client import Client
from simrun_core.config import DEFAULT_ENDPOINT

F = TypeVar("F", bound=Callable[..., Any])

endpoint_option = click.option(
    "--endpoint",
    envvar="SIMRUN_ENDPOINT",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    show_envvar=True,
    metavar="HOST:PORT",
    help="Where simrun (its gateway) listens.",
)
token_option = click.option(
    "--token",
    envvar="SIMRUN_TOKEN",
    default=None,
    show_envvar=True,
    help="Bearer token; default: the token file `simrun server` writes in $SIMRUN_HOME (~/.simrun).",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the API's JSON (proto field names) instead of a table."
)


def with_client(command: F) -> F:
    """Adds --endpoint and --token and passes the command a connected `client`, closed afterwards."""

    @endpoint_option
    @token_option
    @functools.wraps(command)
    def wrapper(*args: Any, endpoint: str, token: str | None, **kwargs: Any) -> Any:
        with Client(endpoint, token) as client:
            return command(*args, client=client, **kwargs)

    return wrapper  # type: ignore[return-value]
