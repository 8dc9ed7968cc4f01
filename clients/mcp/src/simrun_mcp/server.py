"""The MCP server of the bridge: simrun's tools for agents, each one call (or a bounded watch) of the typed client.

The bridge keeps no state of its own: every answer comes from the simrun server, so any number of bridges (or a
restarted one) see the same runs. Every blocking call runs in a worker thread under a deadline, so a stuck simrun,
git or network never hangs a tool; every failure becomes a `ToolError` the model can act on (`simrun_mcp.errors`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
import regex
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field
from simrun.v1 import common_pb2, tracker_pb2
from simrun_client.client import Client, git_toplevel
from simrun_core.errors import FailedPrecondition, InvalidArgument
from simrun_core.telemetry import Telemetry, process_telemetry

from simrun_mcp import convert, models
from simrun_mcp.errors import tool_error
from simrun_mcp.roots import Roots

T = TypeVar("T")
log = logging.getLogger("simrun_mcp")

SERVICE_NAME = "simrun-mcp"
"""The bridge's OpenTelemetry service name (`OTEL_SERVICE_NAME` overrides it)."""

MAX_WATCH_S = 120.0
DEFAULT_WATCH_S = 60.0
MAX_TAIL_LINES = 500
MAX_PAGE_SIZE = 100
# An open WatchRun stream holds one of the server's calls (it bounds them, 1000 by default, and refuses more) and
# one of the bridge's threads; past this share a bridge's further watches poll GetRun instead.
DEFAULT_MAX_STREAMS = 100
# Seconds a watch may run past its timeout_s while its last read comes back.
WATCH_GRACE_S = 1.0
# Seconds of matching one get_logs call may spend on its pattern: a pattern that backtracks without end (nested
# repeats such as `(a|a)+$`) is stopped there, inside the match (`regex`'s timeout), so no thread goes on computing.
MATCH_BUDGET_S = 5.0

INSTRUCTIONS = """\
simrun runs simulation workflows (parameter scans, repeated fits) from a git working tree on a shared cluster.
Start with whoami() to learn your priority tier. Check a workflow file with estimate_run(workflow_path), then
submit_run(workflow_path, group=…, request_id=…): pick a fresh request_id per intended run and reuse it when you
retry after a timeout, so a retry never starts a second run. Follow a run with watch_run(run_id), calling it again
until `ended` is true; read it with get_run(run_id), its logs with get_logs(run_id), compare finished runs with
compare_runs(run_ids). Runs outlive this conversation: their ids stay valid.
"""

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

# Ids and names are short; a bound keeps a mistaken argument from reaching simrun (whose refusal would echo it).
MAX_ID_CHARS = 200
RunIdArg = Annotated[
    str,
    Field(description="The run's id, as submit_run or list_runs returned it.", min_length=1, max_length=MAX_ID_CHARS),
]
WorkflowArg = Annotated[
    str,
    Field(
        description="Path of a workflow YAML file in a git working tree under the bridge's roots; a relative "
        "path starts at the first root. The run runs on a snapshot of that working tree, uncommitted changes "
        "included.",
        min_length=1,
        max_length=4096,
    ),
]


class Bridge:
    """The tools over one typed client (the agent's token) and the roots the agent may submit from.

    Args:
        client: the typed client; its unary calls' deadline is `client.timeout_s`.
        roots: where workflow files may be read.
        call_timeout_s: the longest any tool call waits for simrun, beyond a watch's own timeout.
        max_streams: watches that may hold a WatchRun stream at once; further ones poll GetRun every `poll_s`.
        poll_s: seconds between two reads of a polled watch.
        max_threads: blocking calls (watches included) that may run at once.
        telemetry: where the spans of the tool calls go (`simrun-mcp`); by default the client's.
    """

    def __init__(
        self,
        client: Client,
        roots: Roots,
        *,
        call_timeout_s: float = 60.0,
        max_streams: int = DEFAULT_MAX_STREAMS,
        poll_s: float = 0.5,
        max_threads: int = 200,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.client = client
        self.telemetry = telemetry or client.telemetry
        self.roots = roots
        self.call_timeout_s = call_timeout_s
        self.poll_s = poll_s
        self._limiter = anyio.CapacityLimiter(max_threads)
        # anyio's Semaphore needs an initial value of 0 or more; 0 makes every watch poll.
        self._streams = anyio.Semaphore(max_streams)

    async def blocking(self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None, **kwargs: Any) -> T:
        """Runs a blocking call in a worker thread; gives up after its deadline (the thread is abandoned)."""
        deadline = self.call_timeout_s if deadline_s is None else deadline_s
        try:
            with anyio.fail_after(deadline):
                return await anyio.to_thread.run_sync(
                    functools.partial(fn, *args, **kwargs), limiter=self._limiter, abandon_on_cancel=True
                )
        except TimeoutError:
            raise ToolError(
                f"simrun did not answer within {deadline:g} s. Call the tool again in a little while; a submit_run "
                "with the same request_id is safe to retry."
            ) from None

    # -- the tools ---------------------------------------------------------------------------------------------

    async def whoami(self) -> models.WhoAmI:
        """Who you are to simrun: your identity, the priority tier of your runs, and what preempts whom.

        Every run you submit goes at this tier; the gateway decides it from the bridge's token, not you.
        """
        return convert.whoami(await self.blocking(self.client.identity))

    async def submit_run(
        self,
        workflow_path: WorkflowArg,
        ctx: Context,
        group: Annotated[
            str | None,
            Field(
                description="The run's group (a study, or your subagents' runs); default: the workflow's.",
                max_length=MAX_ID_CHARS,
            ),
        ] = None,
        single_server: Annotated[bool, Field(description="Place each split task's pod on one server.")] = False,
        reserve: Annotated[
            str | None, Field(description="A node (see list_nodes) only this run may use.", max_length=MAX_ID_CHARS)
        ] = None,
        request_id: Annotated[
            str | None,
            Field(
                description="An id you pick for this submission (e.g. a UUID). Submitting again with the same id "
                "returns the first run instead of starting another: reuse it when you retry after a timeout.",
                max_length=200,
            ),
        ] = None,
        wait_s: Annotated[
            float,
            Field(
                description="Seconds to wait for the run to end before returning, at most 120; 0 returns at once.",
                ge=0,
                le=MAX_WATCH_S,
            ),
        ] = 0,
    ) -> models.SubmitResult:
        """Submit a workflow file: simrun snapshots its git working tree and runs it; returns the run (run_id, state).

        Retried submissions with the same request_id return the first run. With wait_s the call waits (sending
        progress notifications per unit) until the run ends or wait_s passes; then follow it with watch_run.
        """
        path = self.roots.workflow(workflow_path)
        tree = self.roots.check_tree(await self.blocking(git_toplevel, path))
        run = await self.blocking(
            self.client.submit,
            path,
            model=tree,
            group=group,
            single_server=single_server,
            reserve=reserve,
            request_id=request_id,
        )
        waited = 0.0
        if wait_s > 0:
            started = time.monotonic()
            run, _ = await self._watch(run.run_id, wait_s, ctx, until_change=False)
            waited = round(time.monotonic() - started, 3)
        return models.SubmitResult(
            **convert.run_fields(run, await self._summaries(run)), workflow_path=str(path), waited_s=waited
        )

    async def get_run(self, run_id: RunIdArg) -> models.RunInfo:
        """A run now: its state, its tasks with units done, its message, its tasks' summaries and memory kills."""
        run = await self.blocking(self.client.get_run, run_id)
        return models.RunInfo(**convert.run_fields(run, await self._summaries(run)))

    async def watch_run(
        self,
        run_id: RunIdArg,
        ctx: Context,
        timeout_s: Annotated[
            float, Field(description="Seconds to wait at most, 0 to 120.", ge=0, le=MAX_WATCH_S)
        ] = DEFAULT_WATCH_S,
    ) -> models.WatchResult:
        """Wait for a run to change: returns when its state or a task's state changes, when it ends, or at timeout_s.

        While it waits it sends a progress notification per unit done. If `ended` is false, call it again.
        """
        run, changed = await self._watch(run_id, timeout_s, ctx, until_change=True)
        done, total, _ = convert.progress(run)
        ended = run.state in _FINAL
        return models.WatchResult(
            **convert.run_fields(run, await self._summaries(run)),
            changed=changed,
            timed_out=not changed and not ended,
            progress=done,
            total=total,
        )

    async def list_runs(
        self,
        group: Annotated[
            str | None, Field(description="Only this group's runs; omit for every group.", max_length=MAX_ID_CHARS)
        ] = None,
        state: Annotated[models.RunStateName | None, Field(description="Only runs in this state.")] = None,
        owner: Annotated[
            str | None, Field(description="Only runs this identity submitted (see whoami).", max_length=MAX_ID_CHARS)
        ] = None,
        page_size: Annotated[int, Field(description="Runs per page, 1 to 100.", ge=1, le=MAX_PAGE_SIZE)] = 20,
        page_token: Annotated[
            str | None,
            Field(description="The next_page_token of the previous page; omit for the first.", max_length=1000),
        ] = None,
    ) -> models.RunList:
        """List runs, newest first, one page at a time: each with its state and units done."""
        page = await self.blocking(
            self.client.list_runs_page,
            group=group or None,
            state=state,
            owner=owner,
            page_size=page_size,
            page_token=page_token,
        )
        return models.RunList(runs=[convert.run_summary(r) for r in page.runs], next_page_token=page.next_page_token)

    async def compare_runs(
        self,
        run_ids: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]] | None,
            Field(description="The runs to compare, at most 50; omit to compare a group.", max_length=50),
        ] = None,
        group: Annotated[
            str | None, Field(description="Compare this group's runs (when run_ids is empty).", max_length=MAX_ID_CHARS)
        ] = None,
        only_differences: Annotated[bool, Field(description="Only the rows where the runs' values differ.")] = False,
    ) -> models.Comparison:
        """Put the summary values of runs side by side: one row per task and summary key, a value per run."""
        if not run_ids and not group:
            raise InvalidArgument("give the runs to compare in run_ids, or a group")
        if run_ids and group:
            raise InvalidArgument("give run_ids or a group, not both")
        response = await self.blocking(self.client.compare, run_ids=run_ids or [], group=group)
        return convert.comparison(response, only_differences)

    async def get_logs(
        self,
        run_id: RunIdArg,
        task_id: Annotated[
            str | None,
            Field(
                description="The task; default: the failed task, else the running one, else the last.",
                max_length=MAX_ID_CHARS,
            ),
        ] = None,
        worker: Annotated[
            str | None,
            Field(
                description="Only this pod's log: w0 (the coordinator), w1, …; default: every pod.",
                max_length=MAX_ID_CHARS,
            ),
        ] = None,
        tail_lines: Annotated[int, Field(description="Last lines per pod, 1 to 500.", ge=1, le=MAX_TAIL_LINES)] = 50,
        pattern: Annotated[
            str | None,
            Field(description="Only lines matching this regular expression (Python syntax).", max_length=1000),
        ] = None,
    ) -> models.Logs:
        """The last lines of a task's pod logs, optionally only those matching a pattern. Never follows."""
        try:
            compiled = regex.compile(pattern) if pattern else None
        except regex.error as exc:
            raise InvalidArgument(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        run = await self.blocking(self.client.get_run, run_id)
        task = task_id or _pick_task(run)
        if task is None:
            raise InvalidArgument(f"run {run_id} has no tasks")
        pods = await self.blocking(self._read_logs, run_id, task, worker, tail_lines, compiled)
        return models.Logs(
            run_id=run_id,
            state=convert.run_state_name(run.state),
            task_id=task,
            pods=pods,
            truncated=any(p.truncated for p in pods),
        )

    async def estimate_run(self, workflow_path: WorkflowArg) -> models.Estimate:
        """Plan a workflow file without running it: each task's pods, cores, memory and, once learned, seconds.

        It checks the workflow as submit_run would (task types, settings), so it is the cheap way to find mistakes.
        """
        path = self.roots.workflow(workflow_path)
        tree = self.roots.check_tree(await self.blocking(git_toplevel, path))
        return convert.estimate(str(path), await self.blocking(self.client.estimate, path, model=tree))

    async def cancel_run(self, run_id: RunIdArg) -> models.CancelResult:
        """Cancel one of your runs and stop its pods. Cancelling a run that has ended changes nothing."""
        try:
            run = await self.blocking(self.client.cancel, run_id)
            cancelled = True
        except FailedPrecondition:
            run = await self.blocking(self.client.get_run, run_id)
            if run.state not in _FINAL:
                raise
            cancelled = False
        fields = convert.run_fields(run)
        return models.CancelResult(
            **{k: fields[k] for k in ("run_id", "state", "ended", "message", "next_step")}, cancelled=cancelled
        )

    async def list_nodes(self) -> models.Nodes:
        """The nodes runs are placed on: cores, memory, GPUs and which run reserves each."""
        return convert.nodes(await self.blocking(self.client.nodes))

    # -- helpers -----------------------------------------------------------------------------------------------

    async def _summaries(self, run: common_pb2.Run) -> dict[str, dict[str, Any]] | None:
        if not any(t.state == common_pb2.TASK_STATE_SUCCEEDED for t in run.tasks):
            return None
        comparison = await self.blocking(self.client.compare, run_ids=[run.run_id])
        return convert.summaries(comparison, convert.Cut())

    async def _watch(
        self,
        run_id: str,
        timeout_s: float,
        ctx: Context,
        *,
        until_change: bool,
    ) -> tuple[common_pb2.Run, bool]:
        """Follows a run for at most `timeout_s`, reporting progress per unit; the run then and whether it changed."""
        run: common_pb2.Run | None = None
        first: tuple[int, ...] | None = None
        reported = -1.0
        changed = False
        seen: common_pb2.Run | None = None
        # The stream (or the polling) ends at the timeout on its own; this returns then even if simrun lags.
        with anyio.move_on_after(timeout_s + WATCH_GRACE_S):
            async with contextlib.aclosing(self._updates(run_id, timeout_s)) as updates:
                async for seen in updates:
                    run = seen
                    done, total, line = convert.progress(run)
                    if done > reported:
                        reported = done
                        await ctx.report_progress(done, total, line)
                    if first is None:
                        first = _states(run)
                    elif _states(run) != first:
                        changed = True
                    if run.state in _FINAL or (until_change and changed):
                        break
        if run is None:
            # The stream ended before its first update (the server stopped, or the timeout was 0).
            run = await self.blocking(self.client.get_run, run_id)
        return run, changed

    async def _updates(self, run_id: str, timeout_s: float) -> AsyncGenerator[common_pb2.Run, None]:
        """The run now and whenever it changes, for at most `timeout_s`: over a WatchRun stream while the bridge
        holds fewer than `max_streams` of them, else by polling GetRun.

        A stream holds one of the server's threads while it is open; a server serves only so many streams at once,
        so past the bridge's share its further watches poll, and other calls still find a thread.
        """
        try:
            self._streams.acquire_nowait()
        except anyio.WouldBlock:
            async for run in self._poll(run_id, timeout_s):
                yield run
            return
        stream = self.client.watch(run_id, timeout_s=timeout_s)
        try:
            while True:
                update = await self.blocking(_next, stream, deadline_s=timeout_s + self.call_timeout_s)
                if update is None:
                    return
                yield update.run
        finally:
            self._streams.release()
            stream.cancel()  # ends the call on the server, and a thread still inside `next` with it

    async def _poll(self, run_id: str, timeout_s: float) -> AsyncGenerator[common_pb2.Run, None]:
        """The run now and whenever its states or units done change, read every `poll_s` for at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        last: tuple[int, ...] | None = None
        while True:
            run = await self.blocking(self.client.get_run, run_id)
            marker = (*_states(run), *(t.units_done for t in run.tasks))
            if marker != last:
                last = marker
                yield run
            remaining = deadline - time.monotonic()
            if run.state in _FINAL or remaining <= 0:
                return
            await anyio.sleep(min(self.poll_s, remaining))

    def _read_logs(
        self, run_id: str, task_id: str, worker: str | None, tail_lines: int, pattern: regex.Pattern[str] | None
    ) -> list[models.PodLog]:
        """Reads the logs once (no follow) within the call deadline, keeping the last lines per pod; the pattern
        gets `MATCH_BUDGET_S` of matching in all."""
        match_deadline = time.monotonic() + MATCH_BUDGET_S
        kept: dict[str, deque[str]] = {}
        matched: dict[str, int] = {}
        long_lines: set[str] = set()
        for chunk in self.client.logs(run_id, task_id, worker=worker, follow=False, timeout_s=self.call_timeout_s):
            lines = kept.setdefault(chunk.pod, deque(maxlen=tail_lines))
            for line in chunk.lines.splitlines():
                if pattern is not None and not _matches(pattern, line, match_deadline):
                    continue
                matched[chunk.pod] = matched.get(chunk.pod, 0) + 1
                if len(line) > convert.MAX_LINE_CHARS:
                    long_lines.add(chunk.pod)
                    line = line[: convert.MAX_LINE_CHARS - 1] + "…"
                lines.append(line)
        return [
            models.PodLog(
                pod=pod,
                lines=list(lines),
                matched_lines=matched.get(pod, 0),
                truncated=matched.get(pod, 0) > len(lines) or pod in long_lines,
            )
            for pod, lines in sorted(kept.items())
        ]


_FINAL = frozenset({common_pb2.RUN_STATE_SUCCEEDED, common_pb2.RUN_STATE_FAILED, common_pb2.RUN_STATE_CANCELLED})


def _states(run: common_pb2.Run) -> tuple[int, ...]:
    """What counts as a change for watch_run: the run's state and each task's."""
    return (run.state, *(t.state for t in run.tasks))


def _matches(pattern: regex.Pattern[str], line: str, deadline: float) -> bool:
    """Whether `pattern` matches in `line`, within what is left of the call's matching budget.

    Raises:
        InvalidArgument: the budget ran out (the match is stopped inside the engine, so nothing goes on computing).
    """
    try:
        return pattern.search(line, timeout=max(deadline - time.monotonic(), 0.001)) is not None
    except TimeoutError:
        raise InvalidArgument(
            f"pattern {pattern.pattern!r} took more than {MATCH_BUDGET_S:g} s to match the logs (it backtracks, as "
            "nested repeats like (a|a)+ do): give a simpler pattern"
        ) from None


def _next(updates: Iterator[tracker_pb2.WatchRunResponse]) -> tracker_pb2.WatchRunResponse | None:
    return next(updates, None)


def _pick_task(run: common_pb2.Run) -> str | None:
    """The task whose logs an agent most likely wants: the failed one, else the running one, else the last started."""
    for state in (common_pb2.TASK_STATE_FAILED, common_pb2.TASK_STATE_RUNNING):
        for task in run.tasks:
            if task.state == state:
                return task.task_id
    started = [t for t in run.tasks if t.state not in (common_pb2.TASK_STATE_PENDING, common_pb2.TASK_STATE_QUEUED)]
    if started:
        return started[-1].task_id
    return run.tasks[0].task_id if run.tasks else None


def _guarded(name: str, method: Callable[..., Awaitable[T]], telemetry: Telemetry) -> Callable[..., Awaitable[T]]:
    """The tool method, with every failure turned into the `ToolError` the model reads, in a span `tool <name>`
    when spans are recorded (the client's calls, made in worker threads that copy the context, are its children)."""

    @functools.wraps(method)
    async def tool(*args: Any, **kwargs: Any) -> T:
        if not telemetry.recording:
            try:
                return await method(*args, **kwargs)
            except Exception as exc:
                raise tool_error(exc, name) from None
        with telemetry.span(f"tool {name}", attributes={"mcp.tool.name": name}):
            try:
                return await method(*args, **kwargs)
            except Exception as exc:
                raise tool_error(exc, name) from None

    return tool


_TOOLS: list[tuple[str, str, ToolAnnotations]] = [
    ("whoami", "Who am I", READ_ONLY),
    (
        "submit_run",
        "Submit a run",
        ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False),
    ),
    ("get_run", "Get a run", READ_ONLY),
    ("watch_run", "Watch a run", READ_ONLY),
    ("list_runs", "List runs", READ_ONLY),
    ("compare_runs", "Compare runs", READ_ONLY),
    ("get_logs", "Read a task's logs", READ_ONLY),
    ("estimate_run", "Estimate a run", READ_ONLY),
    (
        "cancel_run",
        "Cancel a run",
        ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False),
    ),
    ("list_nodes", "List nodes", READ_ONLY),
]


def build_server(bridge: Bridge, *, name: str = "simrun") -> MCPServer:
    """The MCP server with simrun's tools over `bridge`."""
    # WARNING: uvicorn's access log would print a line per HTTP request; the bridge logs its own failures.
    server: MCPServer = MCPServer(
        name, title="simrun", instructions=INSTRUCTIONS, version=_version(), log_level="WARNING"
    )
    for tool_name, title, hints in _TOOLS:
        method = getattr(bridge, tool_name)
        server.add_tool(
            _guarded(tool_name, method, bridge.telemetry),
            name=tool_name,
            title=title,
            description=" ".join((method.__doc__ or "").split()),
            annotations=hints.model_copy(update={"title": title}),
            structured_output=True,
        )
    return server


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("simrun-mcp")
    except PackageNotFoundError:
        return "0"


def connect(
    endpoint: str | None,
    token: str | None,
    roots: list[str | Path] | Roots,
    *,
    call_timeout_s: float = 60.0,
    max_streams: int = DEFAULT_MAX_STREAMS,
    telemetry: Telemetry | None = None,
) -> tuple[MCPServer, Bridge]:
    """A server and its bridge over a new client of simrun at `endpoint` with `token` (see `Client`); its spans
    (a span per tool call above the client's) go to `telemetry`, by default the OpenTelemetry variables' as
    `simrun-mcp`."""
    telemetry = telemetry or process_telemetry(SERVICE_NAME)
    client = Client(endpoint, token, timeout_s=call_timeout_s, telemetry=telemetry)
    roots = roots if isinstance(roots, Roots) else Roots(roots)
    bridge = Bridge(client, roots, call_timeout_s=call_timeout_s, max_streams=max_streams, telemetry=telemetry)
    return build_server(bridge), bridge


__all__ = ["Bridge", "build_server", "connect"]
