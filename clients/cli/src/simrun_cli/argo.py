"""`simrun render`: the Argo Workflow the kubernetes executor would submit for a workflow, as YAML, nothing run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from simrun_cli.options import endpoint_option, token_option

if TYPE_CHECKING:
    from simrun_core.config import ServerConfig
    from simrun_core.identity import Priority
    from simrun_planner import Node
    from simrun_runtime.record import SnapshotRef

PRIORITIES = ["owner", "standard", "agent"]
"""`simrun_core.identity.Priority`'s values (the command loads no more than click until it runs)."""


PLACEHOLDER_IMAGE = "simrun-render-placeholder.invalid/no-image@sha256:" + "0" * 64
"""The image of a Workflow rendered without one: `.invalid` is never a registry's name (RFC 2606)."""


def _model_root(workflow: Path, model: Path | None) -> Path:
    """The model as a submission finds it: --model, else the innermost `pyproject.toml` folder, else the tree's top.

    Raises:
        InvalidArgument: the workflow is not in a git working tree (and no --model).
    """
    from simrun_client.client import git_toplevel

    from simrun_cli.main import default_model

    if model is not None:
        return model.resolve()
    return default_model(workflow) or git_toplevel(workflow.resolve().parent)


def _server_nodes(endpoint: str, token: str | None) -> tuple[list[Node], Priority]:
    from simrun_client.client import Client
    from simrun_core.config import client_token
    from simrun_core.messages import priority_from_proto
    from simrun_planner.convert import nodes_from_proto

    with Client(endpoint, client_token(token)) as client:
        nodes = nodes_from_proto(client.nodes())
        identity = client.identity()
    return nodes, priority_from_proto(identity.priority)


def _model_environment(model_root: Path, config: ServerConfig) -> tuple[str, Path, list[SnapshotRef], tuple[Path, ...]]:
    """The interpreter to describe the model's types with, the root to describe them from, the run's snapshots and
    the folders of its library snapshots (which the describer may read), as a submission has them: the model's
    working tree and its libraries snapshotted into `<SIMRUN_HOME>/render/store`, their environment locked and
    built in `<SIMRUN_HOME>/render/environments` with the config's index settings (once per lock); with
    `environments.kind: server`, this Python."""
    import dataclasses
    import sys

    from simrun_client.libraries import library_trees
    from simrun_client.snapshots import snapshot_to_store
    from simrun_core.home import simrun_home
    from simrun_envbuilder.convert import settings_from_config
    from simrun_runtime.layout import StoreLayout
    from simrun_runtime.record import SnapshotRef
    from simrun_tracker.kubernetes.preview import model_environment

    cache = simrun_home() / "render"
    store = StoreLayout(cache / "store")
    refs = []
    for tree in [model_root, *library_trees(model_root)]:
        snapshot = snapshot_to_store(tree, store.root).snapshot
        path = store.snapshot(snapshot.name, snapshot.snapshot_id).relative_to(store.root).as_posix()
        refs.append(SnapshotRef(name=snapshot.name, snapshot_id=snapshot.snapshot_id, path=path))
    libraries = tuple(ref.resolve(store) for ref in refs[1:])
    if config.environments.kind == "server":
        return sys.executable, refs[0].resolve(store), refs, libraries
    # A venv to describe with, whatever the server builds for its pods (an image on a cluster).
    settings = dataclasses.replace(
        settings_from_config(config), root=cache / "environments", store=store.root, images=None
    )
    interpreter, root = model_environment(refs, settings, lambda line: click.echo(line, err=True))
    return interpreter, root, refs, libraries


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
    type=click.Choice(PRIORITIES),
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

    The run is planned as a submission plans it: its types described in the model's own environment (locked and
    built here once per lock, with --config's index settings), each task's resources from its type's hint, on the
    nodes of --nodes (or the server's).
    """
    import yaml
    from simrun_core.config import ServerConfig
    from simrun_core.errors import InvalidArgument
    from simrun_core.identity import Priority
    from simrun_core.resources import SplitMode
    from simrun_core.workflow import parse_workflow
    from simrun_planner import Node
    from simrun_tracker.describer import SubprocessDescriber
    from simrun_tracker.kubernetes.config import KubernetesSettings
    from simrun_tracker.kubernetes.preview import preview_workflow

    settings = KubernetesSettings()
    config = ServerConfig()
    if config_file is not None:
        config = ServerConfig.load(config_file)
        settings = KubernetesSettings.model_validate(config.executor.kubernetes or {})
    image = image or settings.default_image
    if not image:
        # An offline preview: a name no registry serves, so the Workflow cannot run by mistake.
        image = PLACEHOLDER_IMAGE
        click.echo(
            f"no --image and no executor.kubernetes.default_image: rendered with the placeholder {PLACEHOLDER_IMAGE}; "
            "pass --image REPO@sha256:… (the run's environment image) for a Workflow to submit",
            err=True,
        )
    if "@sha256:" not in image:
        raise InvalidArgument(f"the image {image!r} is not named by digest: pass --image REPO@sha256:…")
    if nodes_file is not None:
        from simrun_cli.server import load_nodes

        nodes = [Node(n.name, n.cores, n.memory_gb, n.gpus) for n in load_nodes(nodes_file)]
        run_priority = Priority(priority or Priority.STANDARD.value)
    else:
        nodes, run_priority = _server_nodes(endpoint, token)
        run_priority = Priority(priority) if priority else run_priority
    text = workflow.read_text()
    parse_workflow(text, source=str(workflow))  # a bad workflow is refused before any environment is built
    interpreter, model_root, snapshots, libraries = _model_environment(_model_root(workflow, model), config)
    describer = SubprocessDescriber()
    try:
        preview = preview_workflow(
            text,
            model_root,
            nodes,
            describer=describer,
            interpreter=interpreter,
            settings=settings,
            image=image,
            priority=run_priority,
            mode=SplitMode.SINGLE_SERVER if single_server else None,
            snapshots=snapshots,
            libraries=libraries,
        )
    finally:
        describer.close()
    click.echo(yaml.safe_dump(preview.workflow, sort_keys=False, width=120), nl=False)
