"""Turns simrun's messages into the tools' results, cut to sizes an agent's context can take."""

from __future__ import annotations

import json
from typing import Any

from simrun.v1 import common_pb2, tracker_pb2
from simrun_core.identity import PRIORITY_VALUES, PodRole, Priority

from simrun_mcp import models

# Caps that keep one result within a few thousand tokens; a cut result says so in `truncated`.
MAX_TASKS = 50
MAX_SUMMARY_KEYS = 40
MAX_VALUE_CHARS = 500
MAX_MESSAGE_CHARS = 1000
MAX_KILLS = 20
MAX_ROWS = 200
MAX_LINE_CHARS = 500

_PRIORITY_NAMES: dict[common_pb2.Priority.ValueType, models.PriorityName] = {
    common_pb2.PRIORITY_OWNER: "owner",
    common_pb2.PRIORITY_STANDARD: "standard",
    common_pb2.PRIORITY_AGENT: "agent",
}
_WHO = {
    Priority.OWNER: "the cluster's owner and the owner's agents",
    Priority.STANDARD: "the other people",
    Priority.AGENT: "the agents of the other people",
}
_PRIORITY_PROTO = {
    Priority.OWNER: common_pb2.PRIORITY_OWNER,
    Priority.STANDARD: common_pb2.PRIORITY_STANDARD,
    Priority.AGENT: common_pb2.PRIORITY_AGENT,
}
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class Cut:
    """Remembers whether anything was cut on the way to a result."""

    def __init__(self) -> None:
        self.truncated = False

    def text(self, value: str, limit: int = MAX_MESSAGE_CHARS) -> str:
        if len(value) <= limit:
            return value
        self.truncated = True
        return value[: limit - 1] + "…"

    def items(self, values: list[Any], limit: int) -> list[Any]:
        if len(values) <= limit:
            return values
        self.truncated = True
        return values[:limit]


def run_state_name(state: common_pb2.RunState.ValueType) -> models.RunStateName:
    return common_pb2.RunState.Name(state).removeprefix("RUN_STATE_").lower()  # type: ignore[return-value]


def task_state_name(state: common_pb2.TaskState.ValueType) -> models.TaskStateName:
    return common_pb2.TaskState.Name(state).removeprefix("TASK_STATE_").lower()  # type: ignore[return-value]


def priority_name(priority: common_pb2.Priority.ValueType) -> models.PriorityName:
    return _PRIORITY_NAMES.get(priority, "agent")


def _time(stamp: Any, present: bool = True) -> str | None:
    if not present:
        return None
    return stamp.ToDatetime().isoformat() + "Z"


def whoami(identity: common_pb2.Identity) -> models.WhoAmI:
    """The identity with every priority tier and the rules of preemption spelled out."""
    tiers = [
        models.PriorityTier(
            priority=priority_name(_PRIORITY_PROTO[p]),
            who=_WHO[p],
            base=PRIORITY_VALUES[p][PodRole.BASE],
            extra=PRIORITY_VALUES[p][PodRole.EXTRA],
        )
        for p in (Priority.OWNER, Priority.STANDARD, Priority.AGENT)
    ]
    mine = priority_name(identity.priority)
    preemption = (
        f"Your runs go at priority {mine}. A run's coordinator (which merges) and its unsplit tasks get the tier's "
        "base value, its extra workers the extra value. Pods of a higher value preempt pods of a lower one when the "
        "nodes are full: owner runs take capacity from standard and agent runs, standard from agent runs. A new run "
        "also takes back the extra workers of running runs of its own tier, but every running run keeps its "
        "coordinator, so it still finishes; equal values never preempt each other. A preempted worker gives its "
        "units back and waits to be admitted again: results do not change, only the run's wall time."
    )
    return models.WhoAmI(
        name=identity.name,
        kind=identity.kind if identity.kind in ("owner", "person", "agent") else "agent",  # type: ignore[arg-type]
        on_behalf_of=identity.on_behalf_of or None,
        priority=mine,
        tiers=tiers,
        preemption=preemption,
    )


def summaries(comparison: tracker_pb2.CompareRunsResponse, cut: Cut) -> dict[str, dict[str, Any]]:
    """The summary values of the one run compared, per task: {task_id: {key: value}}."""
    found: dict[str, dict[str, Any]] = {}
    for row in comparison.rows:
        if not row.values or not row.values[0]:
            continue
        keys = found.setdefault(row.task_id, {})
        if len(keys) >= MAX_SUMMARY_KEYS:
            cut.truncated = True
            continue
        keys[row.key] = _value(row.values[0], cut)
    return found


def _value(text: str, cut: Cut) -> Any:
    """A summary value from its JSON; a long one as its JSON text, cut."""
    if not text:
        return None
    if len(text) > MAX_VALUE_CHARS:
        return cut.text(text, MAX_VALUE_CHARS)
    try:
        return json.loads(text)
    except ValueError:
        return text


def reused_from(task: common_pb2.Task | tracker_pb2.TaskEstimate) -> models.ReusedFrom | None:
    """Where a task's results come from, when an earlier run's are reused."""
    if not task.HasField("reused_from"):
        return None
    source = task.reused_from
    return models.ReusedFrom(
        run_id=source.run_id, task_id=source.task_id, units=source.units if source.HasField("units") else None
    )


def run_fields(run: common_pb2.Run, task_summaries: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fields of `RunInfo` for a run (the caller adds what its result type adds)."""
    cut = Cut()
    state = run_state_name(run.state)
    tasks = [
        models.TaskInfo(
            task_id=t.task_id,
            type=t.type,
            state=task_state_name(t.state),
            split=t.split,
            units=t.units if t.HasField("units") else None,
            units_done=t.units_done,
            pods=t.plan.pods,
            message=cut.text(t.message),
            summary=(task_summaries or {}).get(t.task_id),
            reused_from=reused_from(t),
        )
        for t in cut.items(list(run.tasks), MAX_TASKS)
    ]
    kills = [
        models.MemoryKill(task_id=k.task_id, worker=k.worker, memory_gb=k.memory_gb, per_worker_gb=k.per_worker_gb)
        for k in cut.items(list(run.oom_kills), MAX_KILLS)
    ]
    model = None
    if run.snapshots:
        s = run.snapshots[0]
        model = models.ModelSource(
            name=s.name,
            snapshot_id=s.snapshot_id,
            branch=s.provenance.branch,
            commit=s.provenance.commit,
            dirty=s.provenance.dirty,
            changed_files=len(s.provenance.changed_files),
        )
    return {
        "run_id": run.run_id,
        "state": state,
        "ended": state in FINAL_STATES,
        "group": run.group,
        "owner": run.identity.name,
        "priority": priority_name(run.identity.priority),
        "message": cut.text(run.message),
        "tasks": tasks,
        "memory_kills": kills,
        "reservation": run.reservation,
        "model": model,
        "create_time": _time(run.create_time),
        "end_time": _time(run.end_time, run.HasField("end_time")),
        "truncated": cut.truncated,
        "next_step": next_step(run),
    }


def next_step(run: common_pb2.Run) -> str:
    """What an agent would call next for this run, in the tools' words."""
    state = run_state_name(run.state)
    if state == "succeeded":
        return (
            f"The run succeeded: its tasks' summaries are here; compare_runs(run_ids=['{run.run_id}', …]) puts it "
            "beside other runs."
        )
    if state == "failed":
        failed = [t.task_id for t in run.tasks if t.state == common_pb2.TASK_STATE_FAILED]
        where = f"get_logs(run_id='{run.run_id}', task_id='{failed[0]}')" if failed else f"get_run('{run.run_id}')"
        return f"The run failed: read why in its message and with {where}; fix the cause and submit again."
    if state == "cancelled":
        return "The run was cancelled; submit_run starts a new one."
    return f"The run goes on: watch_run(run_id='{run.run_id}') follows it (call it again until ended is true)."


def progress(run: common_pb2.Run) -> tuple[float, float, str]:
    """Units done and units in all (an unsplit task is one unit), and a line saying where each task is."""
    done = total = 0
    parts = []
    for t in run.tasks:
        state = task_state_name(t.state)
        if t.HasField("units"):
            done += t.units_done
            total += t.units
            parts.append(f"{t.task_id} {t.units_done}/{t.units} {state}")
        else:
            done += 1 if state == "succeeded" else 0
            total += 1
            parts.append(f"{t.task_id} {state}")
    return float(done), float(total), f"{run_state_name(run.state)}: " + ", ".join(parts)


def run_summary(run: common_pb2.Run) -> models.RunSummary:
    cut = Cut()
    split = [t for t in run.tasks if t.HasField("units")]
    return models.RunSummary(
        run_id=run.run_id,
        state=run_state_name(run.state),
        group=run.group,
        owner=run.identity.name,
        priority=priority_name(run.identity.priority),
        tasks=len(run.tasks),
        units=sum(t.units for t in split),
        message=cut.text(run.message, 200),
        create_time=_time(run.create_time) or "",
        end_time=_time(run.end_time, run.HasField("end_time")),
    )


def comparison(response: tracker_pb2.CompareRunsResponse, only_differences: bool) -> models.Comparison:
    cut = Cut()

    def row_of(row: tracker_pb2.ComparisonRow) -> models.ComparisonRow:
        values = [_value(v, cut) for v in row.values]
        differs = len({json.dumps(v, sort_keys=True) for v in values}) > 1
        return models.ComparisonRow(task_id=row.task_id, key=row.key, values=values, differs=differs)

    sources = [row_of(row) for row in response.sources]
    rows = [r for r in map(row_of, response.rows) if r.differs or not only_differences]
    return models.Comparison(
        run_ids=list(response.run_ids),
        sources=sources,
        rows=cut.items(rows, MAX_ROWS),
        rows_total=len(response.rows),
        truncated=cut.truncated,
    )


def estimate(workflow_path: str, response: tracker_pb2.EstimateRunResponse) -> models.Estimate:
    tasks = [
        models.TaskEstimate(
            task_id=t.task_id,
            pods=t.plan.pods,
            cores_per_pod=t.plan.shape.cores,
            memory_gb_per_pod=t.plan.shape.memory_gb,
            processes_per_pod=t.plan.shape.processes,
            units=t.plan.units if t.plan.HasField("units") else None,
            seconds=t.seconds if t.HasField("seconds") else None,
            base_priority=t.plan.base_priority,
            extra_priority=t.plan.extra_priority,
            memory_reason=t.resources.reason,
            reused_from=reused_from(t),
        )
        for t in response.tasks
    ]
    known = [t.seconds for t in tasks]
    total = sum(s for s in known if s is not None) if all(s is not None for s in known) else None
    return models.Estimate(workflow_path=workflow_path, tasks=tasks, seconds=total)


def nodes(found: list[common_pb2.Node]) -> models.Nodes:
    return models.Nodes(
        nodes=[
            models.NodeInfo(name=n.name, cores=n.cores, memory_gb=n.memory_gb, gpus=n.gpus, reserved_by=n.reserved_by)
            for n in found
        ]
    )
