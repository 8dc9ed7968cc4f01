"""`simrun tokens` (who may call this machine's server) and `simrun learned` (what the learner holds of a key)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from simrun_core.errors import InvalidArgument
from simrun_core.home import simrun_home

from simrun_cli.options import json_option, with_client

if TYPE_CHECKING:
    from simrun_client.client import Client

tokens_file_option = click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The server's tokens file; default: tokens.yaml in $SIMRUN_HOME (~/.simrun).",
)


def _tokens_file(path: Path | None) -> Path:
    path = path or simrun_home() / "tokens.yaml"
    if not path.is_file():
        raise InvalidArgument(f"no tokens file {path}: start `simrun server` once, or give --tokens-file")
    return path


@click.group()
def tokens() -> None:
    """Add, list and remove the tokens of people, agents and services (the server picks changes up at once)."""


@tokens.command("add")
@click.argument("name")
@click.option("--agent-of", metavar="PERSON", help="The token is of an agent acting for PERSON.")
@click.option("--service", is_flag=True, help="A service's token (the run tracker writing the learner).")
@tokens_file_option
def tokens_add(name: str, agent_of: str | None, service: bool, tokens_file: Path | None) -> None:
    """Add a token for NAME and print it once; the file keeps only its hash."""
    from simrun_core.identity import add_token  # here: the other commands need no pydantic

    token, identity = add_token(_tokens_file(tokens_file), name, agent_of, service)
    click.echo(token)
    acting = f", acting for {identity.on_behalf_of}" if identity.on_behalf_of else ""
    click.echo(
        f"token of {identity.name} ({identity.kind.value}{acting}, priority {identity.priority.value}); "
        "it is shown only now: hand it over, e.g. as SIMRUN_TOKEN",
        err=True,
    )


@tokens.command("list")
@tokens_file_option
def tokens_list(tokens_file: Path | None) -> None:
    """List the identities of the tokens file (never a token: the file has only their hashes)."""
    from simrun_core.identity import TokenRegistry

    registry = TokenRegistry.load(_tokens_file(tokens_file))
    for identity in sorted(registry.names(), key=lambda i: (i.person, i.name)):
        acting = f" for {identity.on_behalf_of}" if identity.on_behalf_of else ""
        click.echo(f"{identity.name}\t{identity.kind.value}{acting}\t{identity.priority.value}")


@tokens.command("remove")
@click.argument("name")
@tokens_file_option
def tokens_remove(name: str, tokens_file: Path | None) -> None:
    """Remove every token of NAME."""
    from simrun_core.identity import remove_tokens

    removed = remove_tokens(_tokens_file(tokens_file), name)
    if not removed:
        raise InvalidArgument(f"no token of {name!r} in the tokens file: `simrun tokens list` shows them")
    click.echo(f"removed {removed} token{'s' if removed > 1 else ''} of {name}")


@click.group()
def learned() -> None:
    """Show or forget what the learner has observed of a task type (the cluster's owner only)."""


key_arguments = [
    click.argument("task_type", metavar="TYPE"),
    click.option("--model", required=True, help="The model (the name of its snapshot)."),
    click.option("--cost", "cost_value", default="", help="The value of the type's cost_setting, if it has one."),
]


def _key(command):  # type: ignore[no-untyped-def]
    for decorate in reversed(key_arguments):
        command = decorate(command)
    return command


@learned.command("list")
@_key
@json_option
@with_client
def learned_list(task_type: str, model: str, cost_value: str, as_json: bool, client: Client) -> None:
    """List the observations of a key (TYPE, --model, --cost), oldest first."""
    observations = client.observations(task_type, model, cost_value)
    if as_json:
        from simrun.v1 import learner_pb2

        from simrun_cli import plain

        plain.echo_json(learner_pb2.ListObservationsResponse(observations=observations))
        return
    if not observations:
        click.echo("no observations")
    for o in observations:
        memory = f"{o.per_worker_gb:g} GiB/process" if o.per_worker_gb else "no memory sample"
        oom = f", killed for memory at {o.oom_per_worker_gb:g} GiB/process" if o.oom_killed else ""
        state = "succeeded" if o.succeeded else "failed"
        click.echo(f"{o.observation_id}\t{o.run_id}\t{state}\t{memory}{oom}\t{len(o.unit_seconds)} unit seconds")


@learned.command("forget")
@_key
@with_client
def learned_forget(task_type: str, model: str, cost_value: str, client: Client) -> None:
    """Forget every observation of a key, so its requests come from the type's hint again."""
    deleted = client.forget_observations(task_type, model, cost_value)
    click.echo(f"forgot {deleted} observation{'s' if deleted != 1 else ''} of {task_type} ({model})")
