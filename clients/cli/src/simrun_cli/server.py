"""`simrun server`: every simrun service in this process on one port, over a run store on this machine."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import click
from simrun_core.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:  # imported where used: the other commands start without pydantic and yaml
    from simrun_core.config import NodeConfig, ServerConfig
    from simrun_web.serve import WebServer


def load_nodes(path: Path) -> list[NodeConfig]:
    """The nodes of a YAML file: a list of `{name, cores, memory_gb, gpus}`, or a mapping with such a `nodes:`."""
    import yaml
    from pydantic import TypeAdapter, ValidationError
    from simrun_core.config import NodeConfig
    from simrun_core.validation import first_error

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgument(f"cannot read the nodes file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"the nodes file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(data, dict) and set(data) == {"nodes"}:
        data = data["nodes"]
    try:
        nodes = TypeAdapter(list[NodeConfig]).validate_python(data)
    except ValidationError as exc:
        raise InvalidArgument(f"bad nodes file {path}: {first_error(exc)}") from None
    if not nodes:
        raise InvalidArgument(f"the nodes file {path} names no node")
    return nodes


def check_address(address: str) -> str:
    """`address` when it is `HOST:PORT` with a port from 0 (any free one) to 65535 and a host this machine resolves.

    Raises:
        InvalidArgument: what is wrong with it, in one line.
    """
    host, colon, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:50551
    if not colon or not host:
        raise InvalidArgument(f"--address {address!r}: give HOST:PORT, e.g. 127.0.0.1:50551 (port 0: any free one)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"--address {address!r}: the port must be a number from 0 to 65535")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise InvalidArgument(f"--address {address!r}: cannot resolve the host {host!r} ({reason})") from None
    return address


def check_port_free(address: str) -> None:
    """Refuses an address another process listens at, in one line before anything starts. The probe binds as
    grpc does, with SO_REUSEADDR, so the connections a killed server closed first (waiting out TIME_WAIT for a
    minute) do not refuse its restart.

    Raises:
        FailedPrecondition: the port is taken.
    """
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if int(port) == 0:
        return
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise FailedPrecondition(
                f"cannot listen at {address}: {exc.strerror or exc}; is another simrun server running?"
            ) from None


def prepare_folders(config: ServerConfig) -> None:
    """Makes the home and the store, so that a store the server cannot write is said as such before it serves.

    Raises:
        InvalidArgument: a folder cannot be made or written, with the reason.
    """
    for what, folder in (("home", config.home), ("store", config.store)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".simrun-write-check-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise InvalidArgument(f"cannot use {folder} as the {what}: {exc.strerror or exc}") from None


def server_config(
    config: Path | None,
    store: Path | None,
    address: str | None,
    nodes: Path | None,
    web_address: str | None = None,
    no_web: bool = False,
) -> ServerConfig:
    """The config file's settings (or the defaults), with the options given on the command line on top."""
    from simrun_core.config import ServerConfig

    base = ServerConfig.load(config) if config is not None else ServerConfig()
    updates: dict[str, object] = {}
    if store is not None:
        updates["store"] = store.expanduser().resolve()
    if address is not None:
        updates["address"] = address
    if nodes is not None:
        local = base.executor.local.model_copy(update={"nodes": load_nodes(nodes)})
        updates["executor"] = base.executor.model_copy(update={"local": local})
    if web_address is not None or no_web:
        web = base.web.model_copy(update={"enabled": not no_web, **({"address": web_address} if web_address else {})})
        updates["web"] = web
    merged = base.model_copy(update=updates)
    check_address(merged.address)
    if merged.web.enabled:
        check_web(merged)
    return merged


def check_web(config: ServerConfig) -> None:
    """Refuses a web view beyond loopback in plaintext (its session cookies would travel in the clear)."""
    from simrun_core.config import is_loopback

    if not is_loopback(config.web.address) and config.tls is None and not config.insecure:
        raise InvalidArgument(
            f"--web-address {config.web.address}: beyond loopback the web view needs the config's tls (or insecure: "
            "true, and its session cookies travel in the clear)"
        )


@click.command()
@click.option(
    "--store", type=click.Path(file_okay=False, path_type=Path), help="The run store; default ~/.simrun/store."
)
@click.option(
    "--address",
    envvar="SIMRUN_ENDPOINT",
    show_envvar=True,
    metavar="HOST:PORT",
    help="Where to listen; default 127.0.0.1:50551, where clients look (the same variable tells them both).",
)
@click.option(
    "--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A server config."
)
@click.option(
    "--nodes",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML list of the nodes to run pods on ({name, cores, memory_gb, gpus}); default: this machine.",
)
@click.option(
    "--web-address",
    envvar="SIMRUN_WEB_ADDRESS",
    show_envvar=True,
    metavar="HOST:PORT",
    help="Where the web view listens; default 127.0.0.1:50552 (`simrun ui` opens it).",
)
@click.option("--no-web", is_flag=True, help="Serve no web view.")
def server(
    store: Path | None,
    address: str | None,
    config_file: Path | None,
    nodes: Path | None,
    web_address: str | None,
    no_web: bool,
) -> None:
    """Serve simrun on this machine: every service in this process on one port, and the web view, until Ctrl-C."""
    from simrun_core.homelock import HomeLock
    from simrun_gateway.embedded import EmbeddedServer, serve  # here: the other commands need no services
    from simrun_tracker.server import check_pod_folders

    config = server_config(config_file, store, address, nodes, web_address, no_web)
    if not config.services.tracker:
        check_pod_folders(config)  # before anything is made there
    prepare_folders(config)
    # A second server on the same home most often also has the same address: say the home and the first's pid
    # (the lock itself is taken when the server starts).
    HomeLock(config.home, *([config.store] if not config.services.tracker else [])).release()
    check_port_free(config.address)
    web = open_web(config) if config.web.enabled else None  # bound now: a taken port is refused before serving

    def ready(embedded: EmbeddedServer) -> None:
        click.echo(f"simrun serves at {embedded.address}, runs in {config.store}")
        if config.tokens_file is not None:
            click.echo(f"tokens from {config.tokens_file}")
        elif embedded.token:
            click.echo(f"the owner's token is in {config.home / 'token'}, where clients on this machine find it")
        else:
            click.echo(
                f"tokens from {config.home / 'tokens.yaml'}; there is no {config.home / 'token'}, "
                "so clients need --token or SIMRUN_TOKEN"
            )
        if web is not None:
            start_web(web, config, embedded.address)
            click.echo(f"the web view is at {web.url}: `simrun ui` opens it logged in")
        click.echo("stop it with Ctrl-C")

    try:
        serve(config, ready=ready)  # it locks the home and the store: a second server is refused, naming the first
    except (OSError, RuntimeError) as exc:
        if web is not None:
            web.stop()
        # grpc says RuntimeError ("Failed to bind") when the port is taken; the address itself was checked above.
        if "bind" not in str(exc).lower():
            raise click.ClickException(f"cannot serve at {config.address}: {exc}") from None
        raise click.ClickException(
            f"cannot listen at {config.address}: the port is in use; is another simrun server running?"
        ) from None
    if web is not None:
        web.stop()
        from simrun_cli.web import WEB_URL_FILE

        (config.home / WEB_URL_FILE).unlink(missing_ok=True)
    click.echo("simrun stopped")


def open_web(config: ServerConfig) -> WebServer:
    """The web view's socket, bound (not serving yet)."""
    from simrun_web.serve import WebServer

    tls = config.tls
    return WebServer(config.web.address, cert=tls.cert if tls else None, key=tls.key if tls else None)


def start_web(web: WebServer, config: ServerConfig, gateway: str) -> None:
    """Serves the web view as a client of the gateway at `gateway` (this process's own, reached on loopback)."""
    from simrun_web.app import WebConfig

    from simrun_cli.web import WEB_URL_FILE

    host, _, port = gateway.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    tls = config.tls
    web.start(WebConfig(f"{host}:{port}", tls_ca=(tls.ca or tls.cert) if tls else None))
    url_file = config.home / WEB_URL_FILE
    url_file.write_text(web.url + "\n")
