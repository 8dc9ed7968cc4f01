"""Conversions between the tracker's domain (run records, progress, estimates) and simrun.v1 messages."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from simrun.v1 import common_pb2, tracker_pb2
from simrun_core.errors import InvalidArgument
from simrun_core.identity import Identity, IdentityKind, Priority
from simrun_core.messages import (
    identity_to_proto,
    mode_from_proto,
    provenance_from_proto,
    provenance_to_proto,
    resources_to_proto,
)
from simrun_core.resources import ResolvedResources
from simrun_core.reuse import ReusePolicy
from simrun_core.telemetry import trace_id_of
from simrun_planner import Node, PodShape, TaskPlan
from simrun_planner.convert import plan_to_proto
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import ReusedFrom, RunRecord, RunState, SnapshotRef, TaskState

from simrun_tracker.outputs import Chunk, OutputFile
from simrun_tracker.tracker import Comparison, ReuseRequest, Submission, TaskEstimate, TaskProgress

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

RUN_STATE_TO_PROTO = {state: common_pb2.RunState.Value(f"RUN_STATE_{state.name}") for state in RunState}
RUN_STATE_FROM_PROTO = {value: state for state, value in RUN_STATE_TO_PROTO.items()}
TASK_STATE_TO_PROTO = {state: common_pb2.TaskState.Value(f"TASK_STATE_{state.name}") for state in TaskState}


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
        provenance = provenance_from_proto(snapshot.provenance)
        refs.append(
            SnapshotRef(name=snapshot.name, snapshot_id=snapshot.snapshot_id, path=str(path), provenance=provenance)
        )
    return refs


def submission(store: StoreLayout, request: tracker_pb2.SubmitRunRequest) -> Submission:
    return Submission(
        workflow=request.workflow,
        snapshots=snapshot_refs(store, request.snapshots),
        group=request.group,
        mode=mode_from_proto(request.mode),
        reserve=request.reserve,
        request_id=request.request_id,
        reuse=REUSE_FROM_PROTO.get(request.reuse, ReusePolicy.ANY),
        resume_from=request.resume_from_run_id,
        rerun=tuple(request.rerun),
    )


REUSE_FROM_PROTO = {
    common_pb2.REUSE_POLICY_UNSPECIFIED: ReusePolicy.ANY,
    common_pb2.REUSE_POLICY_NEVER: ReusePolicy.NEVER,
    common_pb2.REUSE_POLICY_SAME_RUN: ReusePolicy.SAME_RUN,
    common_pb2.REUSE_POLICY_ANY: ReusePolicy.ANY,
}


def reuse_request(request: tracker_pb2.EstimateRunRequest) -> ReuseRequest:
    """What an estimate asks of reuse, as a submission would."""
    return ReuseRequest(
        REUSE_FROM_PROTO.get(request.reuse, ReusePolicy.ANY), request.resume_from_run_id, tuple(request.rerun)
    )


def reused_from_message(reused: ReusedFrom | None) -> common_pb2.ReusedFrom | None:
    """Where a task's results come from, if from an earlier run."""
    if reused is None:
        return None
    message = common_pb2.ReusedFrom(run_id=reused.run_id, task_id=reused.task_id)
    if reused.units is not None:
        message.units = reused.units
    return message


def resources_message(resources: dict[str, Any] | None) -> common_pb2.ResolvedResources | None:
    """The message of a task's recorded resources."""
    return resources_to_proto(ResolvedResources(**resources)) if resources else None


def plan_message(plan: dict[str, Any] | None) -> common_pb2.TaskPlan | None:
    """The message of a task's recorded plan."""
    if not plan:
        return None
    return plan_to_proto(TaskPlan(**{**plan, "shape": PodShape(**plan["shape"])}))


def _worker_order(worker: str) -> tuple[int, str]:
    """w0, w1, …, w10 in their numbers' order."""
    return (int(worker[1:]), worker) if worker[1:].isdigit() else (1 << 30, worker)


def run_message(record: RunRecord, progress: list[TaskProgress] | None = None) -> common_pb2.Run:
    done = {p.task_id: p.units_done for p in progress or []}
    identity = record.identity
    run = common_pb2.Run(
        run_id=record.run_id,
        group=record.group,
        identity=identity_to_proto(
            Identity(identity.name, IdentityKind(identity.kind), Priority(identity.priority), identity.on_behalf_of)
        ),
        state=RUN_STATE_TO_PROTO[record.state],
        reservation=record.reservation or "",
        message=record.message,
        workflow=str(record.workflow.get("text", "")),
        environment=record.environment or "",
        trace_id=trace_id_of(record.traceparent),
    )
    for task in record.tasks.values():
        message = run.tasks.add(
            task_id=task.task_id,
            type=task.type,
            split=task.split,
            units_done=done.get(task.task_id, 0),
            state=TASK_STATE_TO_PROTO[task.state],
            message=task.message,
            key=task.key or "",
            pods_started=sum(1 for attempts in task.attempts.values() if attempts > 0),
        )
        message.inputs.update(task.inputs)
        if (reused := reused_from_message(task.reused_from)) is not None:
            message.reused_from.CopyFrom(reused)
        if task.units is not None:
            message.units = task.units
        if (plan := plan_message(task.plan)) is not None:
            message.plan.CopyFrom(plan)
        if (resources := resources_message(task.resources)) is not None:
            message.resources.CopyFrom(resources)
        kills = Counter(kill.worker for kill in record.oom_kills if kill.task_id == task.task_id)
        for worker in sorted((w for w, n in task.attempts.items() if n > 0), key=_worker_order):
            pod = message.pods.add(
                worker=worker,
                attempts=task.attempts[worker],
                oom_kills=kills[worker],
                sigkills=task.sigkills.get(worker, 0),
            )
            if worker in task.measured_memory_gb:
                pod.peak_memory_gb = task.measured_memory_gb[worker]
            if worker in task.nodes:
                pod.node = task.nodes[worker]
            if worker in task.memory_gb:
                pod.memory_gb = task.memory_gb[worker]
    for snapshot in record.snapshots:
        run.snapshots.add(
            name=snapshot.name,
            snapshot_id=snapshot.snapshot_id,
            path=snapshot.path,
            provenance=provenance_to_proto(snapshot.provenance),
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
    for key, values in comparison.sources:
        response.sources.add(key=key, values=values)
    return response


def estimate_message(estimates: list[TaskEstimate]) -> tracker_pb2.EstimateRunResponse:
    response = tracker_pb2.EstimateRunResponse()
    for estimate in estimates:
        task = response.tasks.add(task_id=estimate.planned.task_id)
        task.plan.CopyFrom(plan_to_proto(estimate.planned.plan))
        task.resources.CopyFrom(resources_to_proto(estimate.planned.resources))
        if estimate.seconds is not None:
            task.seconds = estimate.seconds
        if (reused := reused_from_message(estimate.reused_from)) is not None:
            task.reused_from.CopyFrom(reused)
    return response


def output_file_message(file: OutputFile) -> tracker_pb2.OutputFile:
    """The message of a file of an output port."""
    return tracker_pb2.OutputFile(
        task_id=file.task_id, port=file.port, path=file.path, store_path=file.store_path, size_bytes=file.size_bytes
    )


def output_chunk_message(chunk: Chunk) -> tracker_pb2.FetchOutputResponse:
    """The message of a piece of a fetched output file."""
    return tracker_pb2.FetchOutputResponse(
        path=chunk.path, offset=chunk.offset, data=chunk.data, size_bytes=chunk.size_bytes
    )
