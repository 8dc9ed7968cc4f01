"""End to end with a third-party MCP client: the MCP Inspector's CLI drives `simrun-mcp` over stdio."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import REPO, TOKENS, wait_final, write_workflow
from simrun.v1 import common_pb2

INSPECTOR = REPO / "node_modules" / ".bin" / "mcp-inspector"
BRIDGE = Path(sys.executable).parent / "simrun-mcp"

pytestmark = pytest.mark.skipif(
    not INSPECTOR.exists() or shutil.which("node") is None,
    reason="the MCP Inspector comes from `npm ci` (scripts/test runs it)",
)


def inspector(tmp_path: Path, server_address: str, roots: Path, *arguments: str) -> subprocess.CompletedProcess:
    """`mcp-inspector --cli simrun-mcp … ARGUMENTS`: the bridge as the Inspector starts it, with the agent's token."""
    env = {**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "inspector-catalog.json"), "HOME": str(tmp_path)}
    bridge_env = [
        "-e",
        f"SIMRUN_ENDPOINT={server_address}",
        "-e",
        f"SIMRUN_TOKEN={TOKENS['agent']}",
        "-e",
        f"SIMRUN_MCP_ROOTS={roots}",
    ]
    # The target goes before --tool-arg, which takes every word after it.
    command = [str(INSPECTOR), "--cli", *bridge_env, str(BRIDGE), *arguments]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=90, check=False)


def _json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout)


def test_the_inspector_lists_the_tools_submits_a_run_and_reads_it_back(start_server, client_for, e2e_model, tmp_path):
    server = start_server()
    workflow = write_workflow(
        e2e_model, "tasks: {values: {type: 'e2etasks.tasks:Slow', settings: {units: 3, seconds: 0.1, seed: 9}}}"
    )

    listed = _json(inspector(tmp_path, server.address, e2e_model, "--method", "tools/list"))
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert {"whoami", "submit_run", "watch_run", "get_run", "cancel_run"} <= set(tools)
    assert "run_id" in tools["get_run"]["outputSchema"]["properties"]
    assert tools["cancel_run"]["annotations"]["destructiveHint"] is True

    submitted = _json(
        inspector(
            tmp_path,
            server.address,
            e2e_model,
            "--method",
            "tools/call",
            "--tool-name",
            "submit_run",
            "--tool-arg",
            f"workflow_path={workflow}",
        )
    )
    run = submitted["structuredContent"]
    assert run["state"] == "submitting" and run["priority"] == "agent" and run["owner"] == "bob-agent"
    assert not submitted.get("isError")

    # A second call, a second bridge process: the run lives in the simrun server, not in the bridge.
    assert wait_final(client_for(server, "agent"), run["run_id"]).state == common_pb2.RUN_STATE_SUCCEEDED
    got = _json(
        inspector(
            tmp_path,
            server.address,
            e2e_model,
            "--method",
            "tools/call",
            "--tool-name",
            "get_run",
            "--tool-arg",
            f"run_id={run['run_id']}",
        )
    )["structuredContent"]
    assert got["run_id"] == run["run_id"] and got["state"] == "succeeded"

    # An agent's first call: every argument of a listing tool is optional.
    listed_runs = inspector(tmp_path, server.address, e2e_model, "--method", "tools/call", "--tool-name", "list_runs")
    assert listed_runs.returncode == 0, listed_runs.stdout + listed_runs.stderr
    assert [r["run_id"] for r in _json(listed_runs)["structuredContent"]["runs"]] == [run["run_id"]]
    for name, tool in tools.items():
        if name.startswith("list_"):
            assert not tool["inputSchema"].get("required"), (name, tool["inputSchema"])
    assert got["tasks"][0]["units_done"] == 3 and got["tasks"][0]["summary"]["units"] == 3

    # An error reaches the Inspector as a tool error (its exit code 5) with the bridge's words, no traceback.
    failed = inspector(
        tmp_path,
        server.address,
        e2e_model,
        "--method",
        "tools/call",
        "--tool-name",
        "get_run",
        "--tool-arg",
        "run_id=no-such-run",
    )
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "no run 'no-such-run'" in failed.stdout + failed.stderr
    assert "Traceback" not in failed.stdout
