"""The `simrun` command: submit, follow, list, compare and cancel runs; serve simrun on this machine."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from simrun_core.errors import SimrunError

from simrun_cli import __version__
from simrun_cli.lazy import lazy_module
from simrun_cli.options import json_option, with_client

if TYPE_CHECKING:
    from rich.console import Console
    from simrun.v1 import common_pb2, envbuilder_pb2, tracker_pb2
    from simrun_client.client import Client

    from simrun_cli import plain, render
else:
    # Imported on first use: `simrun --version` or `--help` needs none of them, `simrun status` not all, and a
    # command that prints JSON or one line (`plain`) no rich (`render`).
    common_pb2 = lazy_module("simrun.v1.common_pb2")
    tracker_pb2 = lazy_module("simrun.v1.tracker_pb2")
    envbuilder_pb2 = lazy_module("simrun.v1.envbuilder_pb2")
    plain = lazy_module("simrun_cli.plain")
    render = lazy_module("simrun_cli.render")

RUN_STATES = ["submitting", "queued", "running", "succeeded", "failed", "cancelled"]
"""The run states `list --state` takes: `RunState` without its prefix (a test keeps them equal)."""


LAZY_COMMANDS = {
    "server": "simrun_cli.server:server",
    "render": "simrun_cli.argo:render_command",
    "tokens": "simrun_cli.admin:tokens",
    "learned": "simrun_cli.admin:learned",
    "ui": "simrun_cli.web:ui",
    "web": "simrun_cli.web:web",
}
"""The commands defined in modules of their own (`name: module:attribute`), imported when named (or by --help)."""


class SimrunGroup(click.Group):
    """The command group; a typed simrun error becomes one line saying what to fix (exit 1), never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SimrunError as exc:
            raise click.ClickException(" ".join(str(exc).split()) or type(exc).__name__) from None


@click.group(cls=SimrunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="simrun")
def cli() -> None:
    """Run simulation workflows from your git working tree: on this machine or on a cluster."""


workflow_argument = click.argument("workflow", type=click.Path(exists=True, dir_okay=False, path_type=Path))
model_option = click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help=(
        "The model's folder; default: the innermost folder holding a pyproject.toml from the workflow's folder "
        "up to the top of its git working tree, else that top."
    ),
)
store_option = click.option(
    "--store",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The run store, when it is mounted here: write the snapshot into it instead of uploading it.",
)
single_server_option = click.option(
    "--single-server", is_flag=True, help="Place each split task's pod on one server (mode single-server)."
)


def reuse_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--reuse, --resume-from and --rerun: where earlier results with the same task keys may come from."""
    for option in reversed(
        (
            click.option(
                "--reuse",
                type=click.Choice(["never", "same-run", "any"]),
                help="Reuse earlier results with the same task key: never, only from --resume-from (same-run), "
                "or from any run you may read (any, the default).",
            ),
            click.option("--resume-from", metavar="RUN", help="Reuse this run's results first."),
            click.option("--rerun", metavar="TASK", multiple=True, help="Compute TASK again (repeatable)."),
        )
    ):
        command = option(command)
    return command


@cli.command()
@workflow_argument
@click.option("--group", help="The run's group, e.g. a study; default: the workflow's, else `default`.")
@single_server_option
@click.option("--reserve", metavar="NODE", help="Reserve this node for the run.")
@model_option
@store_option
@click.option(
    "--request-id",
    metavar="ID",
    help="An id you pick for this submission: retrying with the same id returns the first run, not a new one.",
)
@click.option("--watch", is_flag=True, help="Follow the run with a progress bar per task until it ends.")
@reuse_options
@json_option
@with_client
def submit(
    workflow: Path,
    group: str | None,
    single_server: bool,
    reserve: str | None,
    model: Path | None,
    store: Path | None,
    request_id: str | None,
    watch: bool,
    reuse: str | None,
    resume_from: str | None,
    rerun: tuple[str, ...],
    as_json: bool,
    client: Client,
) -> None:
    """Submit WORKFLOW, run on a snapshot of its git working tree (uncommitted changes included).

    A task whose key (type, settings, snapshots, environment and upstream keys) an earlier run you may read
    computed already is not computed again: its outputs are hard links of the earlier ones.
    """
    model = model or default_model(workflow)
    run = client.submit(
        workflow,
        model=model,
        group=group,
        single_server=single_server,
        reserve=reserve,
        store=store,
        reuse=reuse,
        resume_from=resume_from,
        rerun=rerun,
        request_id=request_id,
    )
    out = render.console()
    if not as_json:
        from rich.text import Text

        out.print(Text.assemble("submitted run ", (run.run_id, "bold"), f" (group {run.group or 'default'})"))
        _environment_progress(out, run, "")  # what the lock decided (a stale uv.lock locked again) shows once
    if watch:
        _follow(client, run.run_id, out, as_json)
    elif as_json:
        plain.echo_json(run)
    else:
        out.print(f"follow it with `simrun status {run.run_id} --watch`")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("."),
    show_default="the current folder's git working tree",
    help="The model's working tree, snapshotted again.",
)
@store_option
@click.option("--rerun", metavar="TASK", multiple=True, help="Compute TASK again (repeatable).")
@click.option("--watch", is_flag=True, help="Follow the run with a progress bar per task until it ends.")
@json_option
@with_client
def resume(
    run_id: str,
    model: Path,
    store: Path | None,
    rerun: tuple[str, ...],
    watch: bool,
    as_json: bool,
    client: Client,
) -> None:
    """Run RUN's workflow again on a fresh snapshot of the model, reusing what RUN (and your other runs) computed.

    After a failure or a cancellation only the missing tasks, and of a split task the missing units, are computed;
    an edited file changes the keys of the tasks it may affect, which are computed again.
    """
    run = client.resume(run_id, model=model, store=store, rerun=rerun)
    out = render.console()
    if not as_json:
        from rich.text import Text

        out.print(Text.assemble("submitted run ", (run.run_id, "bold"), f", resuming {run_id}"))
    if watch:
        _follow(client, run.run_id, out, as_json)
    elif as_json:
        plain.echo_json(run)
    else:
        out.print(f"follow it with `simrun status {run.run_id} --watch`")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--watch", is_flag=True, help="Follow the run with a progress bar per task until it ends.")
@json_option
@with_client
def status(run_id: str, watch: bool, as_json: bool, client: Client) -> None:
    """Show a run: its state, its tasks' progress and, once it succeeded, their summaries."""
    if watch:
        _follow(client, run_id, None if as_json else render.console(), as_json)
        return
    run = client.get_run(run_id)
    if as_json:
        from simrun_client.reading import run_json

        plain.echo_json(run_json(run, client.outputs(run.run_id)))
        return
    _show_run(client, run)


@cli.command("list")
@click.option("--group", help="Only this group's runs.")
@click.option("--state", type=click.Choice(RUN_STATES), help="Only runs in this state.")
@click.option("--owner", help="Only runs submitted by this identity.")
@json_option
@with_client
def list_runs(group: str | None, state: str | None, owner: str | None, as_json: bool, client: Client) -> None:
    """List runs, newest first."""
    runs = client.list_runs(group=group, state=state, owner=owner)
    if as_json:
        plain.echo_json(tracker_pb2.ListRunsResponse(runs=runs))
    elif not runs:
        click.echo("no runs")
    else:
        render.echo(render.runs_table(runs))


@cli.command()
@click.argument("run_ids", metavar="[RUN]...", nargs=-1)
@click.option("--group", help="Compare the runs of this group.")
@json_option
@with_client
def compare(run_ids: tuple[str, ...], group: str | None, as_json: bool, client: Client) -> None:
    """Put the summary values of runs (or of a group's runs) side by side."""
    if not run_ids and not group:
        raise click.UsageError("give the runs to compare, or --group")
    if run_ids and group:
        raise click.UsageError("give the runs to compare or --group, not both")
    comparison = client.compare(run_ids=list(run_ids), group=group)
    from simrun_client.compare import differing_settings

    settings = differing_settings([client.get_run(run_id) for run_id in comparison.run_ids])
    if as_json:
        # The API's comparison, plus the settings that differ between the runs in the same row shape.
        data = plain.to_dict(comparison)
        data["settings"] = [{"task_id": t, "key": k, "values": v} for t, k, v in settings]
        plain.echo_json(data)
    elif not comparison.run_ids:
        click.echo("no runs to compare")
    else:
        render.echo(render.comparison_table(comparison, settings))


@cli.command()
@workflow_argument
@single_server_option
@model_option
@store_option
@reuse_options
@json_option
@with_client
def estimate(
    workflow: Path,
    single_server: bool,
    model: Path | None,
    store: Path | None,
    reuse: str | None,
    resume_from: str | None,
    rerun: tuple[str, ...],
    as_json: bool,
    client: Client,
) -> None:
    """Plan WORKFLOW without running it: each task's pods, resources, once learned seconds, and what it reuses."""
    result = client.estimate(
        workflow,
        model=model or default_model(workflow),
        single_server=single_server,
        store=store,
        reuse=reuse,
        resume_from=resume_from,
        rerun=rerun,
    )
    if as_json:
        plain.echo_json(result)
    else:
        render.echo(render.estimate_table(result))


@cli.command()
@click.argument("run_id", metavar="RUN")
@json_option
@with_client
def cancel(run_id: str, as_json: bool, client: Client) -> None:
    """Cancel a run and stop its pods."""
    run = client.cancel(run_id)
    if as_json:
        plain.echo_json(run)
    else:
        click.echo(f"cancelled run {run.run_id} (now {plain.run_state(run.state)})")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("task_id", metavar="TASK")
@click.option("--worker", metavar="WORKER", help="Only this worker's log: w0 (the coordinator), w1, …")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the task ends.")
@click.option(
    "--unit", type=click.IntRange(min=0), metavar="N", help="Only what unit N printed (its `[unit N] ` lines)."
)
@with_client
def logs(run_id: str, task_id: str, worker: str | None, follow: bool, unit: int | None, client: Client) -> None:
    """Print the logs of a task's pods."""
    pod = None
    for chunk in client.logs(run_id, task_id, worker=worker, follow=follow):
        lines = chunk.lines if unit is None else unit_lines(chunk.lines, unit)
        if not lines:
            continue
        if not worker and chunk.pod != pod:
            # Several pods' logs interleave; name each one where it starts, as `tail` does.
            click.echo(f"==> {chunk.pod} <==")
            pod = chunk.pod
        click.echo(lines, nl=False)


def default_model(workflow: Path) -> Path | None:
    """The model of a workflow given without --model: the innermost folder with a `pyproject.toml` on the way from
    the workflow's folder up to the top of its git working tree (`examples/montecarlo` in simrun's own tree).

    None where there is none, so the client takes the working tree's top, as it always did.
    """
    from simrun_client.client import git_toplevel

    folder = workflow.resolve().parent
    top = git_toplevel(folder)
    for candidate in (folder, *folder.parents):
        if (candidate / "pyproject.toml").is_file():
            return candidate
        if candidate == top:
            break
    return None


def unit_lines(lines: str, unit: int) -> str:
    """The lines a unit printed, without their `[unit N] ` prefix (the runtime puts it on each unit's lines)."""
    prefix = f"[unit {unit}] "
    return "".join(line.removeprefix(prefix) for line in lines.splitlines(keepends=True) if line.startswith(prefix))


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", help="The source name; default: the tree's folder name.")
@click.option(
    "--store",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The run store, when it is mounted here: write into it instead of uploading.",
)
@with_client
def snapshot(path: Path, name: str | None, store: Path | None, client: Client) -> None:
    """Snapshot the git working tree at PATH (uncommitted changes included) and print it as JSON."""
    result = client.snapshot(path, name=name, store=store)
    click.echo(json.dumps(result.to_json(), sort_keys=True))


@cli.command()
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Wait up to SECONDS for simrun to start (and write its token file) before answering.",
)
@json_option
@with_client
def whoami(wait_s: float, as_json: bool, client: Client) -> None:
    """Say who your token belongs to and at which priority your runs go."""
    identity = client.wait_ready(wait_s) if wait_s else client.identity()
    if as_json:
        plain.echo_json(identity)
        return
    on_behalf = f", acting for {identity.on_behalf_of}" if identity.on_behalf_of else ""
    click.echo(f"{identity.name} ({identity.kind}{on_behalf}), priority {plain.priority(identity.priority)}")


@cli.command()
@json_option
@with_client
def nodes(as_json: bool, client: Client) -> None:
    """List the nodes runs are placed on, with their reservations."""
    found = client.nodes()
    if as_json:
        plain.echo_json(tracker_pb2.ListNodesResponse(nodes=found))
    else:
        render.echo(render.nodes_table(found))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("task_id", metavar="[TASK", required=False)
@click.argument("port", metavar="[PORT]]", required=False)
@json_option
@with_client
def outputs(run_id: str, task_id: str | None, port: str | None, as_json: bool, client: Client) -> None:
    """List a run's outputs (a task's, a port's): each file with its path in the store and its size."""
    files = client.outputs(run_id, task_id, port)
    if as_json:
        plain.echo_json(tracker_pb2.ListOutputsResponse(files=files))
    elif not files:
        click.echo(
            f"run {run_id} has no output files (a task's appear once it has merged)"
            if not task_id
            else f"no output files of {task_id}"
        )
    else:
        render.echo(render.outputs_table(files))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("task_id", metavar="TASK")
@click.argument("port", metavar="PORT")
@click.argument("dest", metavar="DEST", type=click.Path(path_type=Path))
@with_client
def fetch(run_id: str, task_id: str, port: str, dest: Path, client: Client) -> None:
    """Copy the files of a task's output PORT into the folder DEST, through simrun (no store mount needed)."""
    written = client.fetch_output(run_id, task_id, port, dest)
    size = sum(path.stat().st_size for path in written)
    click.echo(f"fetched {len(written)} file{'s' if len(written) != 1 else ''} ({plain.size(size)}) into {dest}")


def _follow(client: Client, run_id: str, out: Console | None, as_json: bool) -> None:
    """Follows a run to its end: progress bars, then the run; exits 1 unless it succeeded. `out` may be None with
    `as_json` (which draws nothing)."""
    from simrun_client.client import FINAL_RUN_STATES

    run: common_pb2.Run | None = None
    try:
        if as_json or out is None:
            run = client.wait(run_id)
        else:
            with render.RunProgress(out) as bars:
                said = ""
                for update in client.watch(run_id):
                    said = _environment_progress(out, update.run, said)
                    bars.update(update.progress)
                    run = update.run
    except KeyboardInterrupt:
        click.echo(f"stopped following run {run_id}; it goes on: `simrun status {run_id} --watch`", err=True)
        raise click.exceptions.Exit(130) from None
    if run is None or run.state not in FINAL_RUN_STATES:
        run = client.get_run(run_id)
    if as_json or out is None:
        plain.echo_json(run)
    else:
        _show_run(client, run)
    if run.state != common_pb2.RUN_STATE_SUCCEEDED:
        reason = f": {run.message}" if run.message else ""
        failed = [task.task_id for task in run.tasks if task.state == common_pb2.TASK_STATE_FAILED]
        logs = f"; see `simrun logs {run.run_id} {failed[0]}`" if failed else ""
        raise click.ClickException(f"run {run.run_id} {plain.run_state(run.state)}{reason}{logs}")


def _environment_progress(out: Console, run: common_pb2.Run, said: str) -> str:
    """Prints the run's message while it is submitting (its environment's build), each new one once."""
    from rich.text import Text

    if run.state == common_pb2.RUN_STATE_SUBMITTING and run.message and run.message != said:
        out.print(Text(run.message, style="yellow"))
        return run.message
    return said


@cli.command()
@json_option
@with_client
def envs(as_json: bool, client: Client) -> None:
    """List the environments runs use: id, Python, packages, size, when last used, and the image by digest."""
    from simrun_client.environments import list_environments

    found = list_environments(client)
    if as_json:
        plain.echo_json(envbuilder_pb2.ListEnvironmentsResponse(environments=found))
    else:
        render.echo(render.environments_table(found))


def _show_run(client: Client, run: common_pb2.Run) -> None:
    """Prints the run as `simrun status` shows it, with its summaries once it succeeded."""
    succeeded = run.state == common_pb2.RUN_STATE_SUCCEEDED
    render.show(run, client.compare(run_ids=[run.run_id]) if succeeded else None)
