"""The options every command shares: where simrun is (--endpoint), who calls (--token), --json."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

DEFAULT_ENDPOINT = "127.0.0.1:50551"
"""`simrun_core.config.DEFAULT_ENDPOINT`, written out so that parsing options imports no pydantic (a test keeps
them equal)."""

SERVICE_NAME = "simrun-cli"
"""The CLI's OpenTelemetry service name, unless `OTEL_SERVICE_NAME` names it."""

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
tls_ca_option = click.option(
    "--tls-ca",
    envvar="SIMRUN_TLS_CA",
    default=None,
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA bundle (PEM): connect with TLS and verify the gateway's certificate against it.",
)
tls_cert_option = click.option(
    "--tls-cert",
    envvar="SIMRUN_TLS_CERT",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Client certificate (PEM), for a gateway that asks for mutual TLS.",
)
tls_key_option = click.option(
    "--tls-key",
    envvar="SIMRUN_TLS_KEY",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The client certificate's key (PEM).",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the API's JSON (proto field names) instead of a table."
)


def check_token(token: str | None) -> None:
    """Refuses a token grpc cannot send as a header (a newline, a space, a control character) in one line.

    Without this, grpc's C core logs its own complaint to stderr before the call fails.
    """
    if token is None:
        from simrun_core.home import client_token

        token, where = client_token(None), "the token file"
    else:
        where = "--token or SIMRUN_TOKEN"
    if token and any(not (c.isascii() and c.isprintable()) or c.isspace() for c in token):
        raise click.ClickException(
            f"the token from {where} has a newline, a space or a control character in it; give the token alone"
        )


def with_client(command: F) -> F:
    """Adds --endpoint, --token and the TLS options and passes the command a connected `client`, closed afterwards.

    The command runs in a span of its own (`simrun <command>`), above the spans of its calls, when the
    OpenTelemetry variables configure an exporter; its spans are flushed before the command returns. Without one
    nothing would be recorded, and OpenTelemetry is not even imported.
    """

    @endpoint_option
    @token_option
    @tls_ca_option
    @tls_cert_option
    @tls_key_option
    @functools.wraps(command)
    def wrapper(
        *args: Any,
        endpoint: str,
        token: str | None,
        tls_ca: Path | None,
        tls_cert: Path | None,
        tls_key: Path | None,
        **kwargs: Any,
    ) -> Any:
        from simrun_client.client import Client
        from simrun_core.telemetry_env import may_record

        check_token(token)
        if not may_record():
            with Client(endpoint, token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, quick_start=True) as client:
                return command(*args, client=client, **kwargs)
        from simrun_core.telemetry import process_telemetry

        telemetry = process_telemetry(SERVICE_NAME)
        name = click.get_current_context().command_path
        try:
            with (
                telemetry.span(name),
                Client(
                    endpoint, token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, telemetry=telemetry
                ) as client,
            ):
                return command(*args, client=client, **kwargs)
        finally:
            telemetry.flush()

    return wrapper  # type: ignore[return-value]
