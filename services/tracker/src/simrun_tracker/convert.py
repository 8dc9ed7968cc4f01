"""Conversions between the tracker's domain (run records, progress, estimates) and simrun.v1 messages."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2, tracker_pb2
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Priority
from simrun_core.resources import ResolutionRule, SplitMode
from simrun_planner import Node
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import Provenance, RunRecord, RunState, SnapshotRef, TaskState

from simrun_tracker.tracker import Comparison, Submission, TaskEstimate, TaskProgress

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

PRIORITY_TO_PROTO = {
    Priority.OWNER: common_pb2.PRIORITY_OWNER,
    Priority.STANDARD: common_pb2.PRIORITY_STANDARD,
    Priority.AGENT: common_pb2.PRIORITY_AGENT,
}
MODE_FROM_PROTO = {
    common_pb2.SPLIT_MODE_UNSPECIFIED: None,
    common_pb2.SPLIT_MODE_FASTEST: SplitMode.FASTEST,
    common_pb2.SPLIT_MODE_SINGLE_SERVER: SplitMode.SINGLE_SERVER,
}
RUN_STATE_TO_PROTO = {state: common_pb2.RunState.Value(f"RUN_STATE_{state.name}") for state in RunState}
RUN_STATE_FROM_PROTO = {value: state for state, value in RUN_STATE_TO_PROTO.items()}
TASK_STATE_TO_PROTO = {state: common_pb2.TaskState.Value(f"TASK_STATE_{state.name}") for state in TaskState}
RULE_TO_PROTO = {
    ResolutionRule.HINT: common_pb2.RESOLUTION_RULE_HINT,
    ResolutionRule.PERCENTILE: common_pb2.RESOLUTION_RULE_PERCENTILE,
    ResolutionRule.OOM_FLOOR: common_pb2.RESOLUTION_RULE_OOM_FLOOR,
}


def timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def snapshot_refs(store: StoreLayout, snapshots: Any) -> list[SnapshotRef]:
    """Snapshot references from a request; the path is the store's, never the one a client sends."""
    refs = []
    for snapshot in snapshots:
        for field, value in (("name", snapshot.name), ("snapshot_id", snapshot.snapshot_id)):
            if not _SAFE_NAME.match(value):
                raise InvalidArgument(f"snapshot {field} {value!r} must be letters, digits, '.', '_' or '-'")
        path = store.snapshot(snapshot.name, snapshot.snapshot_id).relative_to(store.root)
        provenance = Provenance(
            branch=snapshot.provenance.branch or None,
            commit=snapshot.provenance.commit or None,
            changed_files=list(snapshot.provenance.changed_files),
            dirty=snapshot.provenance.dirty,
        )
        refs.append(
            SnapshotRef(name=snapshot.name, snapshot_id=snapshot.snapshot_id, path=str(path), provenance=provenance)
        )
    return refs


def submission(store: StoreLayout, request: tracker_pb2.SubmitRunRequest) -> Submission:
    return Submission(
        workflow=request.workflow,
        snapshots=snapshot_refs(store, request.snapshots),
        group=request.group,
        mode=MODE_FROM_PROTO[request.mode],
        reserve=request.reserve,
    )


def resources_message(resources: dict[str, Any] | None) -> common_pb2.ResolvedResources | None:
    if not resources:
        return None
    message = common_pb2.ResolvedResources(
        base_memory_gb=resources["base_memory_gb"],
        per_worker_gb=resources["per_worker_gb"],
        cores_per_process=resources["cores_per_process"],
        gpus=resources["gpus"],
        scratch_gb=resources["scratch_gb"],
        rule=RULE_TO_PROTO[ResolutionRule(resources["rule"])],
        reason=resources.get("reason", ""),
    )
    if resources.get("unit_seconds") is not None:
        message.unit_seconds = resources["unit_seconds"]
    return message


def plan_message(plan: dict[str, Any] | None) -> common_pb2.TaskPlan | None:
    if not plan:
        return None
    shape = plan["shape"]
    message = common_pb2.TaskPlan(
        task_id=plan["task_id"],
        pods=plan["pods"],
        shape=common_pb2.PodShape(
            cores=shape["cores"],
            memory_gb=shape["memory_gb"],
            processes=shape["processes"],
            per_worker_gb=shape["per_worker_gb"],
            retry_memory_gb=shape["retry_memory_gb"],
            retry_per_worker_gb=shape["retry_per_worker_gb"],
            scratch_gb=shape["scratch_gb"],
            gpus=shape["gpus"],
        ),
        base_priority=plan["base_priority"],
        extra_priority=plan["extra_priority"],
        coordinator_merges=plan.get("coordinator_merges", False),
    )
    if plan.get("units") is not None:
        message.units = plan["units"]
    return message


def run_message(record: RunRecord, progress: list[TaskProgress] | None = None) -> common_pb2.Run:
    done = {p.task_id: p.units_done for p in progress or []}
    identity = record.identity
    run = common_pb2.Run(
        run_id=record.run_id,
        group=record.group,
        identity=common_pb2.Identity(
            name=identity.name,
            kind=identity.kind,
            on_behalf_of=identity.on_behalf_of or "",
            priority=PRIORITY_TO_PROTO[Priority(identity.priority)],
        ),
        state=RUN_STATE_TO_PROTO[record.state],
        reservation=record.reservation or "",
        message=record.message,
        workflow=str(record.workflow.get("text", "")),
        environment=record.environment or "",
    )
    for task in record.tasks.values():
        message = run.tasks.add(
            task_id=task.task_id,
            type=task.type,
            split=task.split,
            units_done=done.get(task.task_id, 0),
            state=TASK_STATE_TO_PROTO[task.state],
            message=task.message,
        )
        message.inputs.update(task.inputs)
        if task.units is not None:
            message.units = task.units
        if (plan := plan_message(task.plan)) is not None:
            message.plan.CopyFrom(plan)
        if (resources := resources_message(task.resources)) is not None:
            message.resources.CopyFrom(resources)
    for snapshot in record.snapshots:
        run.snapshots.add(
            name=snapshot.name,
            snapshot_id=snapshot.snapshot_id,
            path=snapshot.path,
            provenance=common_pb2.Provenance(
                branch=snapshot.provenance.branch or "",
                commit=snapshot.provenance.commit or "",
                changed_files=snapshot.provenance.changed_files,
                dirty=snapshot.provenance.dirty,
            ),
        )
    for kill in record.oom_kills:
        run.oom_kills.add(
            task_id=kill.task_id,
            worker=kill.worker,
            memory_gb=kill.memory_gb,
            per_worker_gb=kill.per_worker_gb,
            kill_time=timestamp(kill.at),
        )
    for field, value in (
        ("create_time", record.created_at),
        ("update_time", record.updated_at),
        ("end_time", record.ended_at),
    ):
        if (ts := timestamp(value)) is not None:
            getattr(run, field).CopyFrom(ts)
    return run


def progress_messages(progress: list[TaskProgress]) -> list[tracker_pb2.TaskProgress]:
    messages = []
    for p in progress:
        message = tracker_pb2.TaskProgress(
            task_id=p.task_id, units_done=p.units_done, state=TASK_STATE_TO_PROTO[p.state]
        )
        if p.units is not None:
            message.units = p.units
        messages.append(message)
    return messages


def node_message(node: Node) -> common_pb2.Node:
    return common_pb2.Node(
        name=node.name,
        cores=node.cores,
        memory_gb=node.memory_gb,
        gpus=node.gpus,
        reserved_by=node.reserved_by or "",
        allocatable_cores=node.allocatable_cores,
        allocatable_memory_gb=node.allocatable_memory_gb,
    )


def comparison_message(comparison: Comparison) -> tracker_pb2.CompareRunsResponse:
    response = tracker_pb2.CompareRunsResponse(run_ids=comparison.run_ids)
    for task_id, key, values in comparison.rows:
        response.rows.add(task_id=task_id, key=key, values=values)
    return response


def estimate_message(estimates: list[TaskEstimate]) -> tracker_pb2.EstimateRunResponse:
    response = tracker_pb2.EstimateRunResponse()
    for estimate in estimates:
        task = response.tasks.add(task_id=estimate.planned.task_id)
        task.plan.CopyFrom(plan_message(dataclasses.asdict(estimate.planned.plan)))
        task.resources.CopyFrom(resources_message(dataclasses.asdict(estimate.planned.resources)))
        if estimate.seconds is not None:
            task.seconds = estimate.seconds
    return response
