"""End to end: an agent drives simrun through the MCP bridge (the SDK's in-memory client) against a real server."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_support import TOKENS, expected_total, write_workflow
from mcp import Client as MCPClient
from simrun_gateway.embedded import EmbeddedServer
from simrun_mcp.server import connect


def slow(seed: int, units: int = 6, seconds: float = 0.3) -> str:
    return f"""
name: sums
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {{units: {units}, seconds: {seconds}, seed: {seed}}}
"""


@contextlib.asynccontextmanager
async def agent(server: EmbeddedServer, who: str, roots: list[Path], max_streams: int = 8) -> AsyncIterator[MCPClient]:
    """An MCP session with a bridge that calls `server` with the token of `who`, reading under `roots`."""
    mcp_server, bridge = connect(server.address, TOKENS[who], roots, call_timeout_s=30, max_streams=max_streams)
    try:
        async with MCPClient(mcp_server) as client:
            yield client
    finally:
        bridge.client.close()


async def call(client: MCPClient, tool: str, progress: list[float] | None = None, **arguments: Any) -> dict:
    """A tool's structured result; fails the test on a tool error."""

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        assert progress is not None
        progress.append(done)

    result = await client.call_tool(tool, arguments, progress_callback=on_progress if progress is not None else None)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: MCPClient, tool: str, **arguments: Any) -> str:
    """The text a tool error shows the model."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = " ".join(c.text for c in result.content if c.type == "text")
    assert "Traceback" not in text and f"Error executing tool {tool}:" in text, text
    return text


def test_an_agent_submits_watches_reads_lists_and_compares(start_server, e2e_model):
    server = start_server()
    first = write_workflow(e2e_model, slow(1), "first.yaml")
    write_workflow(e2e_model, slow(2), "second.yaml")  # submitted by a relative path below

    async def session() -> None:
        async with agent(server, "agent", [e2e_model]) as client:
            me = await call(client, "whoami")
            assert (me["name"], me["kind"], me["on_behalf_of"], me["priority"]) == (
                "bob-agent",
                "agent",
                "bob",
                "agent",
            )
            assert [t["priority"] for t in me["tiers"]] == ["owner", "standard", "agent"] and "preempt" in me[
                "preemption"
            ]

            estimate = await call(client, "estimate_run", workflow_path="first.yaml")
            assert [(t["task_id"], t["units"]) for t in estimate["tasks"]] == [("values", 6)]
            assert estimate["tasks"][0]["base_priority"] == "simrun-agent-base"

            submitted = await call(client, "submit_run", workflow_path=str(first), group="study")
            run_id = submitted["run_id"]
            assert submitted["state"] == "submitting" and submitted["priority"] == "agent"
            assert submitted["owner"] == "bob-agent" and submitted["model"]["dirty"]

            # watch_run returns on each change of state; its progress notifications climb unit by unit.
            progress: list[float] = []
            watched = []
            for _ in range(30):
                result = await call(client, "watch_run", progress, run_id=run_id, timeout_s=20)
                watched.append(result)
                if result["ended"]:
                    break
            final = watched[-1]
            assert final["state"] == "succeeded" and final["run_id"] == run_id
            assert (final["progress"], final["total"]) == (6, 6)
            assert progress == sorted(progress) and progress[-1] == 6 and len(set(progress)) >= 3, progress
            assert all(w["changed"] or w["ended"] for w in watched)

            got = await call(client, "get_run", run_id=run_id)
            task = got["tasks"][0]
            assert (task["units"], task["units_done"], task["state"]) == (6, 6, "succeeded")
            assert task["summary"] == {"total": expected_total(1, 6), "units": 6}
            assert got["priority"] == "agent" and not got["truncated"] and got["end_time"]

            # A bounded wait at submission: it returns once the run ended.
            waited = await call(client, "submit_run", workflow_path="second.yaml", group="study", wait_s=60)
            assert waited["state"] == "succeeded" and waited["ended"] and waited["waited_s"] > 0
            second_id = waited["run_id"]

            page = await call(client, "list_runs", group="study", page_size=1)
            assert [r["run_id"] for r in page["runs"]] == [second_id] and page["next_page_token"]
            rest = await call(client, "list_runs", group="study", page_size=1, page_token=page["next_page_token"])
            assert [r["run_id"] for r in rest["runs"]] == [run_id] and rest["next_page_token"] == ""
            assert (rest["runs"][0]["tasks"], rest["runs"][0]["units"]) == (1, 6) and rest["runs"][0][
                "state"
            ] == "succeeded"
            assert (await call(client, "list_runs", group="", state="running"))["runs"] == []

            compared = await call(client, "compare_runs", run_ids=[run_id, second_id], only_differences=True)
            assert compared["run_ids"] == [run_id, second_id]
            rows = {(r["task_id"], r["key"]): r["values"] for r in compared["rows"]}
            assert rows == {("values", "total"): [expected_total(1, 6), expected_total(2, 6)]}
            everything = await call(client, "compare_runs", group="study")
            assert everything["rows_total"] == 2 and len(everything["rows"]) == 2
            sources = {r["key"]: r for r in everything["sources"]}
            assert sources["model"]["values"] == ["e2e-model", "e2e-model"] and not sources["model"]["differs"]
            assert sources["snapshot"]["values"][0] and len(sources["commit"]["values"][0]) == 40

            logs = await call(client, "get_logs", run_id=run_id, tail_lines=1)
            assert logs["task_id"] == "values" and logs["pods"][0]["pod"] == "w0.log"
            assert len(logs["pods"][0]["lines"]) == 1 and logs["pods"][0]["truncated"]
            matched = await call(client, "get_logs", run_id=run_id, task_id="values", pattern=r"exit code \d+")
            assert matched["pods"][0]["matched_lines"] == 1 and "exit code 0" in matched["pods"][0]["lines"][0]

            nodes = await call(client, "list_nodes")
            assert nodes["nodes"] == [{"name": "node-a", "cores": 2, "memory_gb": 8.0, "gpus": 0, "reserved_by": ""}]

    anyio.run(session)


def test_refusals_are_tool_errors_that_say_what_to_do(start_server, e2e_model, tmp_path):
    server = start_server()
    misspelled = write_workflow(
        e2e_model, "tasks: {values: {type: 'e2etasks.tasks:Slow', settings: {unitz: 3}}}", "typo.yaml"
    )
    long_run = write_workflow(e2e_model, slow(3, units=40, seconds=0.5), "long.yaml")
    outside = tmp_path / "outside.yaml"
    outside.write_text(slow(1))

    async def session() -> None:
        async with (
            agent(server, "agent", [e2e_model]) as bob,
            agent(server, "other-agent", [e2e_model]) as carol,
        ):
            text = await refused(bob, "get_run", run_id="no-such-run")
            assert "no run 'no-such-run'" in text and "list_runs" in text and "simrun list" not in text

            text = await refused(bob, "submit_run", workflow_path=str(misspelled))
            assert "unitz" in text and "estimate_run" in text
            text = await refused(bob, "estimate_run", workflow_path=str(misspelled))
            assert "unitz" in text

            text = await refused(bob, "submit_run", workflow_path=str(outside))
            assert "outside the folders this bridge may read" in text
            text = await refused(bob, "submit_run", workflow_path="../outside.yaml")
            assert "outside the folders this bridge may read" in text

            text = await refused(bob, "get_logs", run_id="no-such-run", pattern="(")
            assert "not a regular expression" in text

            run = await call(bob, "submit_run", workflow_path=str(long_run))
            # Another person's run is hidden by the read policy: to carol's agent it does not exist.
            text = await refused(carol, "cancel_run", run_id=run["run_id"])
            assert f"no run '{run['run_id']}'" in text and "list_runs" in text
            cancelled = await call(bob, "cancel_run", run_id=run["run_id"])
            assert cancelled["cancelled"] and cancelled["run_id"] == run["run_id"]
            final = await call(bob, "watch_run", run_id=run["run_id"], timeout_s=30)
            while not final["ended"]:
                final = await call(bob, "watch_run", run_id=run["run_id"], timeout_s=30)
            assert final["state"] == "cancelled"
            again = await call(bob, "cancel_run", run_id=run["run_id"])
            assert not again["cancelled"] and again["state"] == "cancelled"

    anyio.run(session)


def test_a_polled_watch_returns_at_its_timeout_while_the_run_goes_on(start_server, e2e_model):
    """With no stream to spare (max_streams 0) a watch polls: the same changes, progress and timeout."""
    server = start_server()
    long_run = write_workflow(e2e_model, slow(4, units=40, seconds=0.5), "long.yaml")

    async def session() -> None:
        async with agent(server, "agent", [e2e_model], max_streams=0) as client:
            run = await call(client, "submit_run", workflow_path=str(long_run))
            result: dict = {}
            progress: list[float] = []
            # Watch until one returns at its timeout with units done (on a loaded machine the pod may take a few
            # seconds to start: a watch may time out before a unit is done, and one returns at each change).
            for _ in range(30):
                result = await call(client, "watch_run", progress, run_id=run["run_id"], timeout_s=3)
                assert not result["ended"], result
                assert result["timed_out"] != result["changed"], result
                if result["timed_out"] and result["progress"] > 0:
                    break
            assert result["timed_out"] and not result["changed"] and not result["ended"]
            assert result["state"] == "running" and "watch_run" in result["next_step"]
            assert progress == sorted(progress) and progress[-1] > 0 and result["progress"] >= progress[-1]
            await call(client, "cancel_run", run_id=run["run_id"])

    anyio.run(session)


def test_a_retried_submission_with_the_same_request_id_returns_the_first_run(start_server, e2e_model):
    server = start_server()
    workflow = write_workflow(e2e_model, slow(5, units=2, seconds=0.1))

    async def session() -> None:
        async with agent(server, "agent", [e2e_model]) as client:
            first = await call(client, "submit_run", workflow_path=str(workflow), request_id="retry-7", wait_s=60)
            assert first["state"] == "succeeded"
            second = await call(client, "submit_run", workflow_path=str(workflow), request_id="retry-7")
            # The same workflow again (a new request id) would reuse the first run's results, and says so.
            estimate = await call(client, "estimate_run", workflow_path=str(workflow))
            source = {"run_id": first["run_id"], "task_id": "values", "units": None}
            assert estimate["tasks"][0]["reused_from"] == source
            assert estimate["seconds"] == 0
            other = await call(client, "submit_run", workflow_path=str(workflow), request_id="retry-8")
            assert other["tasks"][0]["reused_from"]["run_id"] == first["run_id"]
            reused = await call(client, "watch_run", run_id=other["run_id"], timeout_s=30)
            while not reused["ended"]:
                reused = await call(client, "watch_run", run_id=other["run_id"], timeout_s=30)
            assert reused["state"] == "succeeded" and reused["progress"] == reused["total"] == 2
            listed = await call(client, "list_runs", group="")
            assert second["run_id"] == first["run_id"] != other["run_id"]
            # The first run as it is now: ended, with every unit done.
            assert second["state"] == "succeeded" and second["tasks"][0]["units_done"] == 2
            assert sorted(r["run_id"] for r in listed["runs"]) == sorted({first["run_id"], other["run_id"]})

    anyio.run(session)


def test_results_are_json_the_agent_can_parse(start_server, e2e_model):
    """The text content mirrors the structured content, for hosts that show only text."""
    server = start_server()

    async def session() -> None:
        async with agent(server, "owner", [e2e_model]) as client:
            result = await client.call_tool("whoami", {})
            assert json.loads(result.content[0].text) == result.structured_content
            assert result.structured_content["priority"] == "owner"

    anyio.run(session)


def test_an_agent_over_streamable_http(start_server, e2e_model, tmp_path):
    """`simrun-mcp --http` as a host that connects by URL uses it: the agent's token, a tool error in the tools'
    words, and a request naming another host refused (DNS rebinding from a browser)."""
    server = start_server()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "SIMRUN_ENDPOINT": server.address,
        "SIMRUN_TOKEN": TOKENS["agent"],
        "SIMRUN_MCP_ROOTS": str(e2e_model),
    }
    bridge = subprocess.Popen(
        [sys.executable, "-m", "simrun_mcp", "--http", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert bridge.poll() is None, bridge.communicate()
                time.sleep(0.2)

        async def session() -> None:
            async with MCPClient(url) as client:
                me = await call(client, "whoami")
                assert (me["name"], me["priority"]) == ("bob-agent", "agent")
                text = await refused(client, "get_run", run_id="no-such-run")
                assert "no run 'no-such-run'" in text and "list_runs" in text

        anyio.run(session)
        initialize = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "x", "version": "1"},
                },
            }
        ).encode()
        request = urllib.request.Request(
            url,
            data=initialize,
            headers={
                "Host": f"attacker.example:{port}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=30)
        answer.value.close()
        assert answer.value.code == 421
    finally:
        bridge.terminate()
        out, err = bridge.communicate(timeout=30)
    assert out == b"" and b"Traceback" not in err, err.decode()
