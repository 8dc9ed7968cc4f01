"""The bridge without a simrun: its tool list and schemas, where it may read, deadlines, and what it installs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib.metadata import requires
from pathlib import Path

import anyio
import pytest
from e2e_support import E2E_MODEL, git_repo
from mcp import Client as MCPClient
from simrun_core.errors import InvalidArgument, PermissionDenied
from simrun_mcp.roots import ROOTS_VARIABLE, Roots
from simrun_mcp.server import connect

TOOLS = {
    "whoami": [],
    "submit_run": ["workflow_path", "group", "single_server", "reserve", "request_id", "wait_s"],
    "get_run": ["run_id"],
    "watch_run": ["run_id", "timeout_s"],
    "list_runs": ["group", "state", "owner", "page_size", "page_token"],
    "compare_runs": ["run_ids", "group", "only_differences"],
    "get_logs": ["run_id", "task_id", "worker", "tail_lines", "pattern"],
    "estimate_run": ["workflow_path"],
    "cancel_run": ["run_id"],
    "list_nodes": [],
}
RUN_RESULTS = {"submit_run", "get_run", "watch_run", "cancel_run", "get_logs"}
# Tools an agent may call bare: the listings, and compare_runs (of a group, or of nothing: a clear refusal).
NO_REQUIRED = {"list_runs", "list_nodes", "compare_runs", "whoami"}
# Bytes of tools/list as the server sends it: an agent pays them in context before its first call. It was 40,122
# (71,658 as the Inspector prints it) before the schemas were trimmed; 26,959 after.
TOOLS_LIST_BUDGET = 28_000


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP port that accepts connections and never answers: a stuck simrun."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def _tools(tmp_path: Path) -> list:
    server, bridge = connect("127.0.0.1:1", "t", [tmp_path])

    async def listing() -> list:
        async with MCPClient(server) as client:
            return (await client.list_tools()).tools

    try:
        return anyio.run(listing)
    finally:
        bridge.client.close()


def test_the_tools_their_arguments_and_schemas(tmp_path: Path) -> None:
    tools = {tool.name: tool for tool in _tools(tmp_path)}
    assert set(tools) == set(TOOLS)
    for name, arguments in TOOLS.items():
        tool = tools[name]
        assert list(tool.input_schema.get("properties", {})) == arguments, name
        # Every argument but the first is optional; a listing tool needs none (an agent's first call).
        required = [] if name in NO_REQUIRED else arguments[:1]
        assert tool.input_schema.get("required", []) == required, name
        assert len(tool.description or "") > 40, name
        for argument, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), (name, argument)
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        if name in RUN_RESULTS:
            assert {"run_id", "state"} <= set(tool.output_schema["properties"]), name
            assert tool.output_schema["properties"]["state"]["enum"][:2] == ["submitting", "queued"]
        hints = tool.annotations
        assert hints is not None and hints.open_world_hint is False
        if name in ("submit_run", "cancel_run"):
            assert hints.read_only_hint is False
        else:
            assert hints.read_only_hint is True and hints.idempotent_hint is True, name
    assert tools["cancel_run"].annotations.destructive_hint is True
    assert tools["cancel_run"].annotations.idempotent_hint is True
    assert tools["submit_run"].annotations.destructive_hint is False
    assert tools["watch_run"].input_schema["properties"]["timeout_s"]["maximum"] == 120


def test_the_tool_list_is_small(tmp_path: Path) -> None:
    tools = _tools(tmp_path)
    sent = json.dumps({"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]})
    assert len(sent) <= TOOLS_LIST_BUDGET, len(sent)

    def titles(schema: object) -> int:
        if isinstance(schema, dict):
            own = sum(isinstance(p, dict) and "title" in p for p in schema.get("properties", {}).values())
            return own + sum(titles(v) for v in schema.values())
        return sum(titles(v) for v in schema) if isinstance(schema, list) else 0

    for tool in tools:
        # An output property's pydantic title is its name again; a nullable one is `type: [T, "null"]`.
        assert titles(tool.output_schema) == 0, tool.name
        assert '"anyOf": [{"type": "string"}, {"type": "null"}]' not in json.dumps(tool.output_schema), tool.name
    run = next(t for t in tools if t.name == "get_run").output_schema
    assert run["properties"]["end_time"]["type"] == ["string", "null"]


def test_arguments_out_of_bounds_are_refused(tmp_path: Path) -> None:
    server, bridge = connect("127.0.0.1:1", "t", [tmp_path])

    async def session() -> list[str]:
        async with MCPClient(server) as client:
            texts = []
            for tool, arguments in [
                ("watch_run", {"run_id": "r", "timeout_s": 600}),
                ("get_logs", {"run_id": "r", "tail_lines": 100000}),
                ("list_runs", {"group": "", "state": "sleeping"}),
                ("get_run", {"run_id": "r" * 100_000}),
                ("compare_runs", {"run_ids": ["r" * 100_000]}),
            ]:
                result = await client.call_tool(tool, arguments)
                assert result.is_error, tool
                texts.append(result.content[0].text)
            return texts

    try:
        texts = anyio.run(session)
    finally:
        bridge.client.close()
    assert "timeout_s" in texts[0] and "tail_lines" in texts[1] and "state" in texts[2]
    # An id past any real one's length is refused before it reaches simrun (whose refusal would echo it).
    assert "run_id" in texts[3] and "at most 200 characters" in texts[3] and "run_ids" in texts[4]


def test_a_stuck_simrun_never_hangs_a_tool(silent_endpoint: str, tmp_path: Path) -> None:
    server, bridge = connect(silent_endpoint, "t", [tmp_path], call_timeout_s=1)

    async def session() -> tuple[str, float]:
        async with MCPClient(server) as client:
            started = time.monotonic()
            result = await client.call_tool("get_run", {"run_id": "r"})
            assert result.is_error
            return result.content[0].text, time.monotonic() - started

    try:
        text, elapsed = anyio.run(session)
    finally:
        bridge.client.close()
    assert "did not answer" in text and "again" in text and "Traceback" not in text, text
    assert elapsed < 30


def test_an_unreachable_simrun_is_a_tool_error_in_the_tools_words(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, bridge = connect(f"127.0.0.1:{port}", "t", [tmp_path], call_timeout_s=5)

    async def session() -> str:
        async with MCPClient(server) as client:
            result = await client.call_tool("list_nodes", {})
            assert result.is_error
            return result.content[0].text

    try:
        text = anyio.run(session)
    finally:
        bridge.client.close()
    assert "not available" in text and "list_nodes again" in text, text


class TestRoots:
    def test_a_workflow_under_a_root_resolves(self, tmp_path: Path) -> None:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "w.yaml").write_text("tasks: {}")
        roots = Roots([tmp_path])
        assert roots.workflow("m/w.yaml") == (tmp_path / "m" / "w.yaml").resolve()
        assert roots.workflow(str(tmp_path / "m" / "w.yaml")) == (tmp_path / "m" / "w.yaml").resolve()

    def test_dot_dot_and_absolute_paths_outside_are_refused(self, tmp_path: Path) -> None:
        root = tmp_path / "root"
        root.mkdir()
        (tmp_path / "secret.yaml").write_text("tasks: {}")
        roots = Roots([root])
        for path in ["../secret.yaml", str(tmp_path / "secret.yaml"), "sub/../../secret.yaml", "/etc/passwd"]:
            with pytest.raises(PermissionDenied, match="outside the folders"):
                roots.workflow(path)
        # A missing file outside the roots is refused the same way: nothing is said about what exists there.
        with pytest.raises(PermissionDenied):
            roots.workflow("../missing.yaml")
        with pytest.raises(InvalidArgument, match="no workflow file"):
            roots.workflow("missing.yaml")
        with pytest.raises(InvalidArgument, match="NUL character"):
            roots.workflow("w\x00.yaml")

    def test_symlinks_out_of_the_roots_are_refused(self, tmp_path: Path) -> None:
        root = tmp_path / "root"
        root.mkdir()
        (tmp_path / "secret.yaml").write_text("tasks: {}")
        (root / "link.yaml").symlink_to(tmp_path / "secret.yaml")
        (root / "linked-dir").symlink_to(tmp_path)
        roots = Roots([root])
        with pytest.raises(PermissionDenied):
            roots.workflow("link.yaml")
        with pytest.raises(PermissionDenied):
            roots.workflow("linked-dir/secret.yaml")
        # A symlink inside the roots to a file inside them is fine.
        (root / "real.yaml").write_text("tasks: {}")
        (root / "alias.yaml").symlink_to(root / "real.yaml")
        assert roots.workflow("alias.yaml") == (root / "real.yaml").resolve()

    def test_a_root_itself_given_through_a_symlink_is_resolved(self, tmp_path: Path) -> None:
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "w.yaml").write_text("tasks: {}")
        (tmp_path / "alias").symlink_to(tmp_path / "real")
        assert Roots([tmp_path / "alias"]).workflow("w.yaml") == (tmp_path / "real" / "w.yaml").resolve()

    def test_roots_from_the_environment_or_the_working_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir()
        b.mkdir()
        monkeypatch.setenv(ROOTS_VARIABLE, f"{a}{os.pathsep}{b}")
        assert Roots.from_environment().paths == (a.resolve(), b.resolve())
        assert Roots.from_environment([str(b)]).paths == (b.resolve(),)
        monkeypatch.delenv(ROOTS_VARIABLE)
        monkeypatch.chdir(a)
        assert Roots.from_environment().paths == (a.resolve(),)
        with pytest.raises(InvalidArgument, match="not a folder"):
            Roots([tmp_path / "nope"])

    def test_a_working_tree_reaching_above_the_roots_is_refused(self, tmp_path: Path) -> None:
        model = git_repo(E2E_MODEL, tmp_path / "model")
        (model / "sub").mkdir()
        roots = Roots([model / "sub"])
        with pytest.raises(PermissionDenied, match="reaches outside"):
            roots.check_tree(model)
        assert Roots([model]).check_tree(model) == model.resolve()


def test_the_bridge_installs_and_imports_no_service_code() -> None:
    """simrun-mcp and simrun-client depend on libraries only, and importing the bridge loads no service."""
    services = {"simrun-planner", "simrun-learner", "simrun-snapshot", "simrun-tracker", "simrun-gateway"}
    seen: set[str] = set()
    todo = ["simrun-mcp"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in requires(name) or []:
            if "extra ==" in requirement:
                continue
            dep = requirement.split(";")[0].split("[")[0]
            for sep in "=<>!~ ":
                dep = dep.split(sep)[0]
            if dep.startswith("simrun-"):
                todo.append(dep)
    assert "simrun-client" in seen and not (seen & services), seen
    code = (
        "import json, sys, simrun_mcp.server, simrun_mcp.__main__; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('simrun_planner', 'simrun_learner', 'simrun_snapshot', 'simrun_tracker', 'simrun_gateway'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(loaded.stdout) == []


def test_the_command_refuses_a_host_that_is_not_loopback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "simrun_mcp", "--http", "--host", "0.0.0.0", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "not a loopback address" in result.stderr
    assert result.stdout == ""


def test_refusals_get_advice_that_fits_the_tool_and_the_error() -> None:
    from simrun_core.errors import NotFound
    from simrun_mcp.errors import tool_error

    reserve = str(
        tool_error(PermissionDenied("bob-agent may not reserve node node-a; submit without --reserve"), "submit_run")
    )
    assert "submit without reserve" in reserve and "whoami()" in reserve and "read every run" not in reserve
    outside = str(tool_error(PermissionDenied("'/etc/x' is outside the folders this bridge may read"), "submit_run"))
    assert outside == "'/etc/x' is outside the folders this bridge may read."
    token = str(tool_error(InvalidArgument("bad page_token: pass the next_page_token"), "list_runs"))
    assert "call list_runs again" in token and "estimate_run" not in token and "workflow" not in token
    setting = str(tool_error(InvalidArgument("task values: unknown setting 'unitz'"), "submit_run"))
    assert "estimate_run(workflow_path)" in setting and "submit_run again" in setting
    estimate = str(tool_error(InvalidArgument("task values: unknown setting 'unitz'"), "estimate_run"))
    assert estimate.count("estimate_run") == 1
    missing = str(tool_error(NotFound("no run 'x': `simrun list` shows the runs"), "get_run"))
    assert "list_runs()" in missing and "simrun" not in missing
    unexpected = str(tool_error(RuntimeError("secret detail"), "get_run"))
    assert "secret detail" not in unexpected and "bridge's log" in unexpected


def test_big_results_are_cut_and_say_so() -> None:
    """A run of many tasks, long messages and a comparison of many rows stay within the caps, flagged `truncated`."""
    from simrun.v1 import common_pb2, tracker_pb2
    from simrun_mcp import convert

    run = common_pb2.Run(run_id="r", state=common_pb2.RUN_STATE_FAILED, message="x" * 5000)
    for i in range(60):
        run.tasks.add(task_id=f"t{i}", type="m:T", state=common_pb2.TASK_STATE_FAILED, message="y" * 3000)
    fields = convert.run_fields(run)
    assert fields["truncated"] and len(fields["tasks"]) == convert.MAX_TASKS
    assert len(fields["message"]) == convert.MAX_MESSAGE_CHARS and fields["message"].endswith("…")
    assert all(len(t.message) <= convert.MAX_MESSAGE_CHARS for t in fields["tasks"])
    small = common_pb2.Run(run_id="r", state=common_pb2.RUN_STATE_SUCCEEDED)
    small.tasks.add(task_id="t", type="m:T", state=common_pb2.TASK_STATE_SUCCEEDED)
    assert not convert.run_fields(small)["truncated"]

    response = tracker_pb2.CompareRunsResponse(run_ids=["a", "b"])
    for i in range(500):
        response.rows.add(task_id="t", key=f"k{i}", values=[str(i), '"' + "z" * 2000 + '"'])
    compared = convert.comparison(response, only_differences=False)
    assert compared.truncated and len(compared.rows) == convert.MAX_ROWS and compared.rows_total == 500
    assert all(len(row.values[1]) <= convert.MAX_VALUE_CHARS for row in compared.rows)
