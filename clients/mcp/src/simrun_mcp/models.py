"""The results of the bridge's tools: pydantic models, so every tool declares its output schema to the agent.

Every result that concerns a run carries `run_id` and `state` under those names. Sizes are capped (see
`simrun_mcp.convert`); a result that was cut says so in its `truncated` field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RunStateName = Literal["submitting", "queued", "running", "succeeded", "failed", "cancelled"]
TaskStateName = Literal["pending", "queued", "running", "succeeded", "failed", "cancelled"]
PriorityName = Literal["owner", "standard", "agent"]


def _compact_schema(schema: dict[str, Any]) -> None:
    """Cut what an agent reads in `tools/list` and learns nothing from: pydantic's titles (the field's name
    again), `anyOf` with null for a nullable value (`type: [T, "null"]` says it), and a null default (every
    result carries every field)."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
        if prop.get("default", 0) is None:
            del prop["default"]
        variants = prop.get("anyOf")
        if variants and len(variants) == 2 and {"type": "null"} in variants:
            (other,) = [v for v in variants if v != {"type": "null"}]
            if set(other) == {"type"} and isinstance(other["type"], str):
                del prop["anyOf"]
                prop["type"] = [other["type"], "null"]


class Result(BaseModel):
    """The base of every result: its JSON schema is compact (`_compact_schema`)."""

    model_config = ConfigDict(json_schema_extra=lambda schema, _cls: _compact_schema(schema))


class PriorityTier(Result):
    """A priority tier and its two priority classes' values."""

    priority: PriorityName
    who: str = Field(description="Whose runs get this tier.")
    base: int = Field(description="The coordinator's class.")
    extra: int = Field(description="The extra workers' class.")


class WhoAmI(Result):
    """Who the bridge's token belongs to, the priority of its runs, and what preempts whom."""

    name: str = Field(description="Your runs' owner.")
    kind: Literal["owner", "person", "agent"]
    on_behalf_of: str | None = Field(description="The person an agent acts for.")
    priority: PriorityName = Field(description="Your runs' tier.")
    tiers: list[PriorityTier] = Field(description="Highest first.")
    preemption: str = Field(description="What preempts whom.")


class ReusedFrom(Result):
    """The earlier run whose results a task takes (the same task key)."""

    run_id: str
    task_id: str
    units: int | None = Field(default=None, description="Units taken; null: all its outputs.")


class TaskInfo(Result):
    """One task of a run."""

    task_id: str
    type: str = Field(description="module:Class")
    state: TaskStateName
    split: bool = Field(description="Split into units.")
    units: int | None = Field(description="Null: unsplit.")
    units_done: int
    pods: int = Field(description="Worker pods planned.")
    message: str = Field(description="Why it failed or was cancelled.")
    summary: dict[str, Any] | None = Field(default=None, description="Its summary.json once it succeeded.")
    reused_from: ReusedFrom | None = Field(default=None, description="Results reused, not computed.")


class MemoryKill(Result):
    """A pod killed for memory (retried once with 1.5× the memory)."""

    task_id: str
    worker: str = Field(description="w0: coordinator; w1…: extra workers.")
    memory_gb: float = Field(description="Pod limit, GiB.")
    per_worker_gb: float = Field(description="Per process, GiB.")


class ModelSource(Result):
    """The snapshot of the model's working tree."""

    name: str
    snapshot_id: str
    branch: str
    commit: str
    dirty: bool = Field(description="Uncommitted changes (in the snapshot).")
    changed_files: int


class RunInfo(Result):
    """A run."""

    run_id: str
    state: RunStateName
    ended: bool = Field(description="Succeeded, failed or cancelled.")
    group: str
    owner: str
    priority: PriorityName
    message: str = Field(description="Why it failed or was cancelled.")
    tasks: list[TaskInfo]
    memory_kills: list[MemoryKill]
    reservation: str = Field(description="The node it reserves.")
    model: ModelSource | None
    create_time: str = Field(description="RFC 3339")
    end_time: str | None = Field(description="RFC 3339")
    truncated: bool = Field(description="Something was cut to keep this small.")
    next_step: str


class SubmitResult(RunInfo):
    """The run submitted (for a request id used before: the first run of it)."""

    workflow_path: str = Field(description="Resolved.")
    waited_s: float = Field(description="Seconds waited.")


class WatchResult(RunInfo):
    """The run when a state changed, it ended, or timeout_s passed."""

    changed: bool = Field(description="A state changed.")
    timed_out: bool = Field(description="timeout_s passed.")
    progress: float = Field(description="Units done (an unsplit task is one).")
    total: float = Field(description="Units in all.")


class RunSummary(Result):
    """A run without its details."""

    run_id: str
    state: RunStateName
    group: str
    owner: str
    priority: PriorityName
    tasks: int = Field(description="Tasks (get_run tells them).")
    units: int = Field(description="Units of its split tasks.")
    message: str
    create_time: str
    end_time: str | None


class RunList(Result):
    """A page of runs, newest first."""

    runs: list[RunSummary]
    next_page_token: str = Field(description="page_token of the next page; empty at the end.")


class ComparisonRow(Result):
    """One summary value across the runs."""

    task_id: str
    key: str = Field(description="Dotted for nested values.")
    values: list[Any] = Field(description="One per run of run_ids.")
    differs: bool = Field(description="Not all equal.")


class Comparison(Result):
    """The summary values of runs side by side."""

    run_ids: list[str] = Field(description="The columns of values.")
    sources: list[ComparisonRow] = Field(description="What each run ran on: model, snapshot, commit, dirty.")
    rows: list[ComparisonRow]
    rows_total: int = Field(description="Before only_differences and the cap.")
    truncated: bool = Field(description="Rows or values were cut.")


class PodLog(Result):
    """The last lines of one pod's log."""

    pod: str = Field(description="w0.log: the coordinator.")
    lines: list[str]
    matched_lines: int = Field(description="Lines matching (all without pattern).")
    truncated: bool = Field(description="Earlier lines left out or long lines cut.")


class Logs(Result):
    """The last lines of a task's pod logs; never follows."""

    run_id: str
    state: RunStateName
    task_id: str = Field(description="Chosen when the call named none.")
    pods: list[PodLog]
    truncated: bool


class TaskEstimate(Result):
    """One task's plan and, once learned, its seconds."""

    task_id: str
    pods: int
    cores_per_pod: int
    memory_gb_per_pod: int
    processes_per_pod: int
    units: int | None = Field(description="Null: unsplit.")
    seconds: float | None = Field(description="Null: not learned yet.")
    base_priority: str = Field(description="The coordinator's class.")
    extra_priority: str = Field(description="The extra workers' class.")
    memory_reason: str = Field(description="Why this memory per process.")
    reused_from: ReusedFrom | None = Field(default=None, description="Results it would reuse.")


class Estimate(Result):
    """The plan of a workflow without running it."""

    workflow_path: str
    tasks: list[TaskEstimate]
    seconds: float | None = Field(description="Summed (reused: 0); null while any is unknown.")


class NodeInfo(Result):
    """A node runs are placed on."""

    name: str
    cores: int = Field(description="For a worker pod.")
    memory_gb: float = Field(description="GiB for a worker pod.")
    gpus: int
    reserved_by: str = Field(description="The run reserving it.")


class Nodes(Result):
    """The nodes of the executor."""

    nodes: list[NodeInfo]


class CancelResult(Result):
    """The run after cancel_run; get_run tells the rest."""

    run_id: str
    state: RunStateName
    ended: bool
    message: str
    next_step: str
    cancelled: bool = Field(description="False: it had ended.")
