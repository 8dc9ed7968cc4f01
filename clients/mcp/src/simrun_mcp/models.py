"""The results of the bridge's tools: pydantic models, so every tool declares its output schema to the agent.

Every result that concerns a run carries `run_id` and `state` under those names. Sizes are capped (see
`simrun_mcp.convert`); a result that was cut says so in its `truncated` field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

RunStateName = Literal["submitting", "queued", "running", "succeeded", "failed", "cancelled"]
TaskStateName = Literal["pending", "queued", "running", "succeeded", "failed", "cancelled"]
PriorityName = Literal["owner", "standard", "agent"]


class PriorityTier(BaseModel):
    """One priority tier: who gets it and the values of its two priority classes."""

    priority: PriorityName
    who: str = Field(description="Whose runs get this tier.")
    base: int = Field(description="Value of the coordinator's (and an unsplit task's) priority class.")
    extra: int = Field(description="Value of the extra workers' priority class.")


class WhoAmI(BaseModel):
    """Who the bridge's token belongs to, the priority of its runs, and what preempts whom."""

    name: str = Field(description="The identity's name; runs you submit have it as their owner.")
    kind: Literal["owner", "person", "agent"]
    on_behalf_of: str | None = Field(description="The person an agent acts for; null for a person.")
    priority: PriorityName = Field(description="The priority tier of every run this identity submits.")
    tiers: list[PriorityTier] = Field(description="Every tier, highest first.")
    preemption: str = Field(description="What preempts whom, in a few sentences.")


class ReusedFrom(BaseModel):
    """The earlier run whose results a task takes instead of computing them (the same task key)."""

    run_id: str
    task_id: str
    units: int | None = Field(
        default=None, description="Units of a split task taken from it; null when its whole outputs are reused."
    )


class TaskInfo(BaseModel):
    """One task of a run."""

    task_id: str
    type: str = Field(description="The task type, `module:Class`.")
    state: TaskStateName
    split: bool = Field(description="Whether the task is split into units that workers claim.")
    units: int | None = Field(description="Units of a split task; null for an unsplit one.")
    units_done: int = Field(description="Units done so far.")
    pods: int = Field(description="Worker pods planned for the task.")
    message: str = Field(description="Why it failed or was cancelled; empty otherwise.")
    summary: dict[str, Any] | None = Field(
        default=None, description="The task's summary values (from its summary.json) once it succeeded."
    )
    reused_from: ReusedFrom | None = Field(
        default=None, description="The earlier run whose results it reused, if any (nothing was computed for them)."
    )


class MemoryKill(BaseModel):
    """A pod killed for memory (it is retried once with 1.5 times the memory per process)."""

    task_id: str
    worker: str = Field(description="w0 for the coordinator, w1… for extra workers.")
    memory_gb: float = Field(description="The pod's memory limit, GiB.")
    per_worker_gb: float = Field(description="Memory per worker process, GiB.")


class ModelSource(BaseModel):
    """Where the run's model came from: the snapshot of the working tree."""

    name: str
    snapshot_id: str
    branch: str
    commit: str
    dirty: bool = Field(description="Whether the working tree had uncommitted changes (they are in the snapshot).")
    changed_files: int = Field(description="Files changed against the commit.")


class RunInfo(BaseModel):
    """A run: its state, its tasks with units done, its message, summaries and memory kills."""

    run_id: str
    state: RunStateName
    ended: bool = Field(description="Whether the run has ended (succeeded, failed or cancelled).")
    group: str
    owner: str = Field(description="The identity that submitted it.")
    priority: PriorityName
    message: str = Field(description="Why it failed or was cancelled; empty otherwise.")
    tasks: list[TaskInfo]
    memory_kills: list[MemoryKill]
    reservation: str = Field(description="The node the run reserves; empty if none.")
    model: ModelSource | None = Field(description="The snapshot of the model the run runs on.")
    create_time: str = Field(description="When it was submitted, RFC 3339.")
    end_time: str | None = Field(description="When it ended, RFC 3339; null while it runs.")
    truncated: bool = Field(description="Whether tasks, summaries, kills or messages were cut to keep this small.")
    next_step: str = Field(description="What to call next.")


class SubmitResult(RunInfo):
    """The submitted run (or, for a request id used before, the first run submitted with it)."""

    workflow_path: str = Field(description="The workflow file, resolved.")
    waited_s: float = Field(description="Seconds the call waited for the run (0 without wait_s).")


class WatchResult(RunInfo):
    """The run when watch_run returned: on a change of the run's or a task's state, at its end, or at the timeout."""

    changed: bool = Field(description="Whether the run's or a task's state changed while watching.")
    timed_out: bool = Field(description="Whether the call returned because timeout_s passed.")
    progress: float = Field(description="Units done (an unsplit task counts as one unit once it succeeded).")
    total: float = Field(description="Units in all (an unsplit task counts as one).")


class RunSummary(BaseModel):
    """A run in a list: its state and progress, without its details."""

    run_id: str
    state: RunStateName
    group: str
    owner: str
    priority: PriorityName
    tasks: int = Field(description="Its tasks; get_run or watch_run tells each one's units done.")
    units: int = Field(description="Units across its split tasks.")
    message: str
    create_time: str
    end_time: str | None


class RunList(BaseModel):
    """A page of runs, newest first."""

    runs: list[RunSummary]
    next_page_token: str = Field(description="Pass it as page_token for the next page; empty at the end.")


class ComparisonRow(BaseModel):
    """One summary value across the runs, in the order of run_ids."""

    task_id: str
    key: str = Field(description="The key in the task's summary (dotted for nested values).")
    values: list[Any] = Field(description="The value in each run, null where a run has none.")
    differs: bool = Field(description="Whether the runs' values are not all equal.")


class Comparison(BaseModel):
    """The summary values of runs side by side."""

    run_ids: list[str] = Field(description="The runs compared: the columns of every row's values.")
    rows: list[ComparisonRow]
    rows_total: int = Field(description="Rows before only_differences and the cap.")
    truncated: bool = Field(description="Whether rows or values were cut to keep this small.")


class PodLog(BaseModel):
    """The last lines of one pod's log."""

    pod: str = Field(description="The pod's log, e.g. w0.log for the coordinator.")
    lines: list[str]
    matched_lines: int = Field(description="Lines of the log (matching the pattern, if one was given).")
    truncated: bool = Field(description="Whether earlier lines were left out (tail_lines) or long lines cut.")


class Logs(BaseModel):
    """The last lines of a task's pod logs; never follows."""

    run_id: str
    state: RunStateName
    task_id: str = Field(description="The task whose logs these are (chosen when the call named none).")
    pods: list[PodLog]
    truncated: bool


class TaskEstimate(BaseModel):
    """The plan of one task and, once learned, its seconds."""

    task_id: str
    pods: int
    cores_per_pod: int
    memory_gb_per_pod: int
    processes_per_pod: int
    units: int | None = Field(description="Units of a split task; null for an unsplit one.")
    seconds: float | None = Field(description="Estimated seconds; null until the units' seconds are learned.")
    base_priority: str = Field(description="Priority class of the coordinator, e.g. simrun-agent-base.")
    extra_priority: str = Field(description="Priority class of the extra workers.")
    memory_reason: str = Field(description="Why the memory per process is what it is.")
    reused_from: ReusedFrom | None = Field(
        default=None, description="The earlier run whose results it would reuse instead of computing them, if any."
    )


class Estimate(BaseModel):
    """The plan of a workflow without running it."""

    workflow_path: str
    tasks: list[TaskEstimate]
    seconds: float | None = Field(
        description="The tasks' seconds added up (a reused task's are 0); null while any is unknown."
    )


class NodeInfo(BaseModel):
    """A node runs are placed on."""

    name: str
    cores: int = Field(description="Whole cores a worker pod can have on it.")
    memory_gb: float = Field(description="GiB of memory a worker pod can have on it.")
    gpus: int
    reserved_by: str = Field(description="The run whose reservation holds the node; empty if free.")


class Nodes(BaseModel):
    """The nodes of the executor."""

    nodes: list[NodeInfo]


class CancelResult(RunInfo):
    """The run after cancel_run."""

    cancelled: bool = Field(description="Whether this call cancelled it (false: it had already ended).")
