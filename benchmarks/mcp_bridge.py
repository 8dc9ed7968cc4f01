"""The MCP bridge's cost: a tool call beside the same client call, and 50 agents watching runs at once over HTTP.

1. Overhead on stdio: `simrun-mcp` runs as a subprocess, as an MCP host starts it; the median of many `get_run`
   tool calls (the SDK's stdio client) beside the median of the same `Client.get_run` call made directly, in the
   same run, against the same embedded server. Several rounds; the figure is the median of the rounds' medians.
   Goal (issue 14): the difference under 5 ms.
2. Watches over HTTP: `simrun-mcp --http` as a subprocess; 50 agents (one MCP session each) call
   `watch_run(timeout_s=…)` on runs of their own at once, while another session's `get_run` calls are timed, beside
   the same calls with nobody watching. Goal: the watches do not slow the other calls (ratio near 1), and every
   watch returns at its timeout, not later.

The runs are recorded but not driven (the server starts no pods), so the machine's cores measure the bridge, not
the simulations; a run that does not change is also exactly what a watch waits on.

    uv run --frozen python benchmarks/mcp_bridge.py [--calls 200] [--rounds 3] [--agents 50] [--watch-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp.client.session import ClientSession
from simrun_client.client import Client
from simrun_core.config import Limits, NodeConfig, ServerConfig
from simrun_gateway.embedded import EmbeddedServer, start_embedded

MODEL = Path(__file__).resolve().parents[1] / "tests" / "e2e_model"
TOKEN = "bench-agent-token"
BRIDGE = str(Path(sys.executable).parent / "simrun-mcp")
WORKFLOW = "tasks:\n  values:\n    type: e2etasks.tasks:Slow\n    settings: {units: 8, seconds: 0.1}\n"


async def _no_check(self: Any, name: str, result: Any) -> None:
    return None


def model_repo(dest: Path) -> Path:
    shutil.copytree(MODEL, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "bench.yaml").write_text(WORKFLOW)
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "model"]):
        subprocess.run(["git", *args], cwd=dest, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return dest


def start_server(root: Path) -> EmbeddedServer:
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"owner": "alice", "tokens": {TOKEN: {"name": "bench-agent", "agent_of": "bob"}}}))
    config = ServerConfig(
        home=root,
        store=root / "store",
        address="127.0.0.1:0",
        tokens_file=tokens,
        nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
        # One identity submits a run per agent and none ends (nothing drives them): past the default bound of 50.
        limits=Limits(active_runs_per_identity=1000),
    )
    return start_embedded(config, drive_runs=False)


def bridge_env(server: EmbeddedServer, model: Path) -> dict[str, str]:
    return {**os.environ, "SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": TOKEN, "SIMRUN_MCP_ROOTS": str(model)}


async def stdio_overhead(server: EmbeddedServer, model: Path, calls: int, rounds: int) -> None:
    with Client(server.address, TOKEN) as client:
        run_id = client.submit(model / "bench.yaml").run_id
        params = StdioServerParameters(command=BRIDGE, env=bridge_env(server, model))
        tool_medians, client_medians = [], []
        async with MCPClient(params) as mcp:
            for _ in range(10):  # warm both paths
                await mcp.call_tool("get_run", {"run_id": run_id})
                client.get_run(run_id)
            for _ in range(rounds):
                tool, direct = [], []
                for _ in range(calls):
                    start = time.perf_counter()
                    result = await mcp.call_tool("get_run", {"run_id": run_id})
                    tool.append(time.perf_counter() - start)
                    assert not result.is_error, result.content
                    start = time.perf_counter()
                    client.get_run(run_id)
                    direct.append(time.perf_counter() - start)
                tool_medians.append(statistics.median(tool))
                client_medians.append(statistics.median(direct))
            # The SDK's client checks every result against the tool's output schema (jsonschema): the host's
            # cost, not the bridge's. The same calls without that check say how the overhead splits.
            unchecked_medians = []
            with mock.patch.object(ClientSession, "validate_tool_result", _no_check):
                for _ in range(rounds):
                    unchecked = []
                    for _ in range(calls):
                        start = time.perf_counter()
                        await mcp.call_tool("get_run", {"run_id": run_id})
                        unchecked.append(time.perf_counter() - start)
                    unchecked_medians.append(statistics.median(unchecked))
    tool_ms, client_ms = statistics.median(tool_medians) * 1e3, statistics.median(client_medians) * 1e3
    print(f"1. get_run over stdio, {rounds} rounds of {calls} calls (medians of the rounds' medians):")
    print(f"   tool call   {tool_ms:7.2f} ms   (rounds: {', '.join(f'{m * 1e3:.2f}' for m in tool_medians)})")
    print(f"   client call {client_ms:7.2f} ms   (rounds: {', '.join(f'{m * 1e3:.2f}' for m in client_medians)})")
    print(f"   overhead    {tool_ms - client_ms:7.2f} ms per call, {tool_ms / client_ms:.1f}x the client call")
    unchecked_ms = statistics.median(unchecked_medians) * 1e3
    print(
        f"   of which the SDK client's schema check of the result: {tool_ms - unchecked_ms:.2f} ms "
        f"(tool call without it {unchecked_ms:.2f} ms, overhead {unchecked_ms - client_ms:.2f} ms)"
    )
    print("   goal: overhead under 5 ms")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"simrun-mcp --http exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit("simrun-mcp --http did not listen in time")


async def timed_calls(mcp: MCPClient, run_id: str, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        result = await mcp.call_tool("get_run", {"run_id": run_id})
        latencies.append(time.perf_counter() - start)
        assert not result.is_error, result.content
    return latencies


async def http_watches(server: EmbeddedServer, model: Path, agents: int, watch_s: float, calls: int) -> None:
    with Client(server.address, TOKEN) as client:
        run_ids = [client.submit(model / "bench.yaml").run_id for _ in range(agents + 1)]
    port = free_port()
    process = subprocess.Popen(
        [BRIDGE, "--http", "--port", str(port)],
        env=bridge_env(server, model),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        url = f"http://127.0.0.1:{port}/mcp"
        async with MCPClient(url) as other:
            await timed_calls(other, run_ids[-1], 10)  # warm
            quiet = await timed_calls(other, run_ids[-1], calls)
            async with contextlib.AsyncExitStack() as stack:
                sessions = [await stack.enter_async_context(MCPClient(url)) for _ in range(agents)]
                # Each session's first result of a tool has the SDK client list the tools and compile a validator
                # of the output schema (a few hundred ms, on this process's loop): pay it before the clock starts,
                # as an agent's own process has, or the 50 compilations would be timed as the watches' delay.
                for session, run_id in zip(sessions, run_ids, strict=False):
                    warm = await session.call_tool("watch_run", {"run_id": run_id, "timeout_s": 0})
                    assert not warm.is_error, warm.content

                async def watch(session: MCPClient, run_id: str) -> tuple[float, bool]:
                    start = time.perf_counter()
                    result = await session.call_tool("watch_run", {"run_id": run_id, "timeout_s": watch_s})
                    assert not result.is_error, result.content
                    return time.perf_counter() - start, bool(result.structured_content["timed_out"])

                started = time.perf_counter()
                watchers = [asyncio.create_task(watch(s, r)) for s, r in zip(sessions, run_ids, strict=False)]
                await asyncio.sleep(min(2.0, watch_s / 4))  # every watch is in flight
                busy = await timed_calls(other, run_ids[-1], calls)
                busy_done = time.perf_counter() - started
                results = await asyncio.gather(*watchers)
    finally:
        process.terminate()
        process.wait(timeout=30)
    quiet_ms, busy_ms = statistics.median(quiet) * 1e3, statistics.median(busy) * 1e3
    durations = [d for d, _ in results]
    print(f"2. {agents} agents each watching a run over HTTP (watch_run timeout_s={watch_s:g}):")
    print(f"   other get_run calls, median: {busy_ms:.2f} ms while watched (done {busy_done:.1f} s after the watches")
    print(f"   began), {quiet_ms:.2f} ms with nobody watching: ratio {busy_ms / quiet_ms:.2f} (goal: near 1)")
    print(f"   load average after: {os.getloadavg()[0]:.1f}")
    print(
        f"   watches: {sum(t for _, t in results)}/{agents} returned at their timeout; took median "
        f"{statistics.median(durations):.2f} s, max {max(durations):.2f} s (timeout {watch_s:g} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--watch-s", type=float, default=8.0)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = start_server(root)
        try:
            model = model_repo(root / "model")
            asyncio.run(stdio_overhead(server, model, args.calls, args.rounds))
            asyncio.run(http_watches(server, model, args.agents, args.watch_s, min(args.calls, 50)))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
