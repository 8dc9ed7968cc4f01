"""`simrun render`: the Argo Workflow the kubernetes executor would submit for a workflow, as YAML, nothing run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import yaml
from simrun_client.client import Client
from simrun_core.config import ServerConfig, client_token
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Priority
from simrun_core.messages import priority_from_proto
from simrun_planner import Node
from simrun_planner.convert import nodes_from_proto

from simrun_cli.options import endpoint_option, token_option
from simrun_cli.server import load_nodes


def _model_root(workflow: Path, model: Path | None) -> Path:
    if model is not None:
        return model.resolve()
    done = subprocess.run(
        ["git", "-C", str(workflow.resolve().parent), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise InvalidArgument(f"{workflow} is not in a git working tree: pass --model with the model's tree")
    return Path(done.stdout.strip())


def _server_nodes(endpoint: str, token: str | None) -> tuple[list[Node], Priority]:
    with Client(endpoint, client_token(token)) as client:
        nodes = nodes_from_proto(client.nodes())
        identity = client.identity()
    return nodes, priority_from_proto(identity.priority)


@click.command("render")
@click.argument("workflow", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--nodes",
    "nodes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML list of nodes ({name, cores, memory_gb, gpus}) to plan on; no server needed. Default: the server's.",
)
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The model's working tree; default: the git working tree that holds the workflow.",
)
@click.option(
    "--image",
    envvar="SIMRUN_IMAGE",
    metavar="REPO@sha256:…",
    help="The run's image by digest; default: the config's executor.kubernetes.default_image.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A server config whose executor.kubernetes settings to render with (namespace, queue, store, image).",
)
@click.option(
    "--priority",
    type=click.Choice([p.value for p in Priority]),
    help="The run's priority with --nodes; default: standard (with the server: the token's identity's).",
)
@click.option("--single-server", is_flag=True, help="Place each split task's pod on one server.")
@endpoint_option
@token_option
def render_command(
    workflow: Path,
    nodes_file: Path | None,
    model: Path | None,
    image: str | None,
    config_file: Path | None,
    priority: str | None,
    single_server: bool,
    endpoint: str,
    token: str | None,
) -> None:
    """Print the Argo Workflow the kubernetes executor would submit for WORKFLOW, as YAML, submitting nothing.

    The run is planned as a submission plans it: its types described from the model's working tree, each task's
    resources from its type's hint, on the nodes of --nodes (or the server's).
    """
    from simrun_core.resources import SplitMode
    from simrun_tracker.describer import SubprocessDescriber
    from simrun_tracker.kubernetes.config import KubernetesSettings
    from simrun_tracker.kubernetes.preview import preview_workflow

    settings = KubernetesSettings()
    if config_file is not None:
        config = ServerConfig.load(config_file)
        settings = KubernetesSettings.model_validate(config.executor.kubernetes or {})
    image = image or settings.default_image
    if not image:
        raise InvalidArgument("no image to render with: pass --image REPO@sha256:… (the run's environment image)")
    if nodes_file is not None:
        nodes = [Node(n.name, n.cores, n.memory_gb, n.gpus) for n in load_nodes(nodes_file)]
        run_priority = Priority(priority or Priority.STANDARD.value)
    else:
        nodes, run_priority = _server_nodes(endpoint, token)
        run_priority = Priority(priority) if priority else run_priority
    describer = SubprocessDescriber()
    try:
        preview = preview_workflow(
            workflow.read_text(),
            _model_root(workflow, model),
            nodes,
            describer=describer,
            interpreter=sys.executable,
            settings=settings,
            image=image,
            priority=run_priority,
            mode=SplitMode.SINGLE_SERVER if single_server else None,
        )
    finally:
        describer.close()
    click.echo(yaml.safe_dump(preview.workflow, sort_keys=False, width=120), nl=False)
