"""The Workflow a run would be, without a run: planned as a submission plans it, rendered as the executor would.

`simrun render` uses it: the workflow's types are described in a subprocess with the model's own environment
(`model_environment`: the working tree snapshotted, its environment locked and built as a submission's is), each
task's resources are its type's hint (the learner's observations live on the server), and the plans come from
`plan_tasks` on the given nodes; the record and its `RunSpec` from the tracker's own builders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simrun_core.errors import FailedPrecondition
from simrun_core.identity import Priority
from simrun_core.resources import ObservationKey, ResolvedResources, SplitMode
from simrun_core.workflow import parse_workflow
from simrun_planner import Node
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Identity, RunRecord, RunState, SnapshotRef

from simrun_tracker.describer import TypeDescriber
from simrun_tracker.kubernetes.config import KubernetesSettings
from simrun_tracker.kubernetes.render import render_workflow
from simrun_tracker.pods import run_spec
from simrun_tracker.submission import describe_tasks, plan_tasks, reserving
from simrun_tracker.tracker import new_run_id, task_records

if TYPE_CHECKING:
    from simrun_envbuilder.builder import BuilderSettings


class HintLearner:
    """A learner without observations: every task gets its type's resource hint (a run before any was learned)."""

    def resolve(self, key: ObservationKey, hint: ResolvedResources) -> ResolvedResources:
        return hint

    def record_reports(self, record: RunRecord, task_id: str, succeeded: bool) -> int:
        return 0

    def estimate(self, key: ObservationKey, units: int, pods: int, processes: int) -> float | None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class Preview:
    """What `simrun render` prints: the Workflow, and the run id it was rendered for."""

    run_id: str
    workflow: dict[str, Any]


def preview_workflow(
    workflow_text: str,
    model_root: Path,
    nodes: list[Node],
    *,
    describer: TypeDescriber,
    interpreter: str,
    settings: KubernetesSettings,
    image: str,
    priority: Priority = Priority.STANDARD,
    mode: SplitMode | None = None,
    grace_s: float = 30.0,
    snapshots: list[SnapshotRef] | None = None,
    libraries: tuple[Path, ...] = (),
) -> Preview:
    """The Workflow the kubernetes executor would submit for a workflow file's run, nothing submitted; `libraries`
    are the folders of the run's library snapshots, which the model's imports may read as at a submission.

    Raises:
        InvalidArgument: a bad workflow (unknown type, misspelled setting, unknown port, a cycle).
        NotFound: an unknown node to reserve.
        FailedPrecondition: a task that fits no node, a taken reservation, or no image.
    """
    workflow = parse_workflow(workflow_text)
    run_id = new_run_id()
    descriptions = describe_tasks(describer, interpreter, model_root, workflow, libraries)
    planned_nodes = reserving(nodes, run_id, workflow.spec.reserve)
    planned = plan_tasks(workflow, descriptions, HintLearner(), planned_nodes, model_root.name, priority, mode, run_id)
    record = RunRecord(
        run_id=run_id,
        identity=Identity(name="render", kind="person", priority=priority.value),
        state=RunState.QUEUED,
        tasks=task_records(workflow, planned, mode),
        environment="render",
        reservation=workflow.spec.reserve,
        snapshots=list(snapshots or []),
    )
    spec = run_spec(record, "render", grace_s, image)
    return Preview(run_id, render_workflow(spec, settings))


def model_environment(
    snapshots: list[SnapshotRef], settings: BuilderSettings, progress: Callable[[str], None]
) -> tuple[str, Path]:
    """The interpreter of a model's own environment and the root to describe its types from, as a submission has
    them: the environment of the snapshots (the model's first, then its libraries', in `settings.store`) locked and
    built in `settings.root` (once per lock: a later render finds it ready), and the model's snapshot as the root.
    A model without `pyproject.toml` gets this Python, as on a server.

    Raises:
        InvalidArgument: a model that cannot be locked (uv's reason), a Python no installed interpreter satisfies.
        FailedPrecondition: its environment failed to build (the builder's reason).
    """
    from simrun_envbuilder.builder import EnvironmentBuilder, EnvironmentState

    store = StoreLayout(Path(settings.store))
    builder = EnvironmentBuilder(settings)
    try:
        environment = builder.resolve(snapshots)
        if environment.state is EnvironmentState.BUILDING:
            progress(f"building the model's environment {environment.environment_id} (once per lock)")
            for now, lines in builder.watch(environment.environment_id):
                for line in lines:
                    progress(line)
                environment = now
        if environment.state is EnvironmentState.FAILED:
            raise FailedPrecondition(
                f"the model's environment {environment.environment_id} failed: {environment.message or 'no reason'}"
            )
        return builder.interpreter(environment.environment_id, snapshots=snapshots), snapshots[0].resolve(store)
    finally:
        builder.close()
