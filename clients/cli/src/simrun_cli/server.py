"""`simrun server`: every simrun service in this process on one port, over a run store on this machine."""

from __future__ import annotations

from pathlib import Path

import click
import yaml
from pydantic import TypeAdapter, ValidationError
from simrun_core.config import NodeConfig, ServerConfig
from simrun_core.errors import InvalidArgument
from simrun_core.validation import first_error


def load_nodes(path: Path) -> list[NodeConfig]:
    """The nodes of a YAML file: a list of `{name, cores, memory_gb, gpus}`, or a mapping with such a `nodes:`."""
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


def server_config(config: Path | None, store: Path | None, address: str | None, nodes: Path | None) -> ServerConfig:
    """The config file's settings (or the defaults), with the options given on the command line on top."""
    base = ServerConfig.load(config) if config is not None else ServerConfig()
    updates: dict[str, object] = {}
    if store is not None:
        updates["store"] = store.expanduser().resolve()
    if address is not None:
        updates["address"] = address
    if nodes is not None:
        local = base.executor.local.model_copy(update={"nodes": load_nodes(nodes)})
        updates["executor"] = base.executor.model_copy(update={"local": local})
    return base.model_copy(update=updates)


@click.command()
@click.option(
    "--store", type=click.Path(file_okay=False, path_type=Path), help="The run store; default ~/.simrun/store."
)
@click.option("--address", metavar="HOST:PORT", help="Where to listen; default 127.0.0.1:50551.")
@click.option(
    "--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A server config."
)
@click.option(
    "--nodes",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML list of the nodes to run pods on ({name, cores, memory_gb, gpus}); default: this machine.",
)
def server(store: Path | None, address: str | None, config_file: Path | None, nodes: Path | None) -> None:
    """Serve simrun on this machine: every service in this process on one port, until Ctrl-C."""
    from simrun_gateway.embedded import EmbeddedServer, serve  # here: the other commands need no services

    config = server_config(config_file, store, address, nodes)

    def ready(embedded: EmbeddedServer) -> None:
        click.echo(f"simrun serves at {embedded.address}, runs in {config.store}")
        if config.tokens_file is None:
            click.echo(f"the owner's token is in {config.home / 'token'}, where clients on this machine find it")
        else:
            click.echo(f"tokens from {config.tokens_file}")
        click.echo("stop it with Ctrl-C")

    try:
        serve(config, ready=ready)
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve at {config.address}: {exc}; is another simrun server running?"
        ) from None
    click.echo("simrun stopped")
