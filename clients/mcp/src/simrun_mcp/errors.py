"""simrun's typed errors as `ToolError`s, in one place: text the model reads and can act on in the tools' words.

The SDK shows the model only a `ToolError`'s message (any other exception becomes "Error executing tool …"), so
every failure of a tool passes through `tool_error`; tracebacks go to the bridge's log on stderr, never to the model.
"""

from __future__ import annotations

import logging
import re

from mcp.server.mcpserver.exceptions import ToolError
from simrun_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SimrunError,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger("simrun_mcp")

# The server's messages name the CLI; an agent has the tools instead.
_CLI_WORDS = [
    (re.compile(r": start it with `simrun server`"), ", where no simrun server runs"),
    (re.compile(r",? where `simrun server` writes one"), ""),
    (re.compile(r"`simrun nodes`"), "list_nodes()"),
    (re.compile(r"`simrun list[^`]*`"), "list_runs()"),
    (re.compile(r"`simrun status[^`]*`"), "get_run(run_id)"),
    (re.compile(r"`simrun logs[^`]*`"), "get_logs(run_id, task_id)"),
    (re.compile(r"`simrun compare[^`]*`"), "compare_runs(run_ids)"),
    (re.compile(r"`simrun cancel[^`]*`"), "cancel_run(run_id)"),
    (re.compile(r"`simrun estimate[^`]*`"), "estimate_run(workflow_path)"),
    (re.compile(r"`simrun submit[^`]*`"), "submit_run(workflow_path)"),
    (re.compile(r"`simrun whoami`"), "whoami()"),
    (re.compile(r"--single-server\b"), "single_server=true"),
    (re.compile(r"--reserve\b"), "reserve"),
    (re.compile(r"--group\b"), "group"),
]

_TOOL_CALL = re.compile(
    r"\b(whoami|submit_run|get_run|watch_run|list_runs|compare_runs|get_logs|estimate_run|cancel_run|list_nodes)\("
)

_WORKFLOW_TOOLS = ("submit_run", "estimate_run")

_ADVICE: list[tuple[type[SimrunError], str]] = [
    (InvalidArgument, "Fix the argument and call {tool} again."),
    (NotFound, "Check the id: list_runs() lists the runs, get_run(run_id) shows a run's tasks."),
    (
        FailedPrecondition,
        "The request does not fit the present state: list_nodes() shows the nodes and their reservations, "
        "get_run(run_id) the run's state.",
    ),
    (
        PermissionDenied,
        "This identity may not do that: whoami() says who you are and at which priority your runs go; you may "
        "change only your own runs.",
    ),
    (AlreadyExists, "It exists already: read it with the get_ or list_ tools instead of creating it."),
]


def _advice(exc: SimrunError, tool: str) -> str | None:
    """What to do next, in the tools' words, for a refusal of `tool`."""
    if isinstance(exc, PermissionDenied) and tool in _WORKFLOW_TOOLS and "outside the folders" in str(exc):
        return None  # the message says already which folders the bridge reads
    if isinstance(exc, InvalidArgument) and tool in _WORKFLOW_TOOLS:
        if tool == "estimate_run":
            return "Fix the workflow file (or the path) and call estimate_run again."
        return (
            "Fix the workflow file (or the argument) and call submit_run again; estimate_run(workflow_path) checks "
            "a workflow without running it."
        )
    for cls, advice in _ADVICE:
        if isinstance(exc, cls):
            return advice.format(tool=tool)
    return None


def tool_error(exc: BaseException, tool: str) -> ToolError:
    """The `ToolError` the model reads for a failure of `tool`."""
    if isinstance(exc, ToolError):
        return exc
    if not isinstance(exc, SimrunError):
        log.error("%s failed unexpectedly", tool, exc_info=exc)
        return ToolError(
            f"{tool} failed inside the simrun bridge ({type(exc).__name__}); the details are in the bridge's log. "
            f"Retrying {tool} may work; a submit_run with the same request_id is safe to retry."
        )
    message = _tool_words(" ".join(str(exc).split())).rstrip(".") or type(exc).__name__
    if isinstance(exc, Unauthenticated):
        return ToolError(
            f"simrun refused the bridge's token ({message}). No tool can help: the person who set up simrun-mcp "
            "must give it a valid token (SIMRUN_TOKEN, or the token file of `simrun server`)."
        )
    if isinstance(exc, Unavailable):
        return ToolError(
            f"simrun is not available right now ({message}). Call {tool} again in a little while; a submit_run "
            "with the same request_id is safe to retry and never starts a second run."
        )
    advice = None if _TOOL_CALL.search(message) else _advice(exc, tool)  # a message may name its tool already
    return ToolError(f"{message}. {advice}" if advice else f"{message}.")


def _tool_words(message: str) -> str:
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message
