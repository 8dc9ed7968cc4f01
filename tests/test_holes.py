"""The holes the last notes left open, each tried on a real server: a bounded pattern match in the MCP bridge,
an abandoned log stream, the environments' read policy, observations recorded once, the log bound, memory learned
from the executor's own measurement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner
from e2e_support import E2E_MODEL, TOKENS, git_repo, wait_final, write_workflow
from envbuilder_support import build_wheelhouse
from holes_model import HOLES
from simrun.v1 import common_pb2
from simrun_cli.main import cli
from simrun_core.config import EnvironmentsConfig
from test_e2e_environments import make_trees, model_pyproject
from test_mcp_bridge import agent, call, refused


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture
def holes_model(tmp_path: Path) -> Path:
    return git_repo(E2E_MODEL, tmp_path / "holes-model", files={"e2etasks/holes.py": HOLES})


def printer(line: str, repeat: int = 1, quiet_s: float = 0.0) -> str:
    settings = json.dumps({"line": line, "repeat": repeat, "quiet_s": quiet_s})
    return f"name: p\ntasks:\n  p:\n    type: e2etasks.holes:Printer\n    settings: {settings}\n"


def _frames_in(function: str) -> int:
    """Threads of this process whose stack is inside `function` now."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == function:
                count += 1
                break
            frame = frame.f_back  # type: ignore[assignment]
    return count


def test_a_catastrophic_log_pattern_is_stopped_inside_the_match(start_server, client_for, holes_model):
    """`(a+)+$` on a line of 200,000 a's answers at once; `(a|a)+$`, which backtracks without end on 40 a's and a
    b, is refused after the bridge's matching budget with what to do, and no thread goes on computing it."""
    from simrun_mcp.server import MATCH_BUDGET_S

    server = start_server()
    owner = client_for(server, "agent")
    long_a = "a" * 200_000
    run = wait_final(owner, owner.submit(write_workflow(holes_model, printer(long_a))).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
    bad = wait_final(owner, owner.submit(write_workflow(holes_model, printer("a" * 40 + "b"), "b.yaml")).run_id)
    assert bad.state == common_pb2.RUN_STATE_SUCCEEDED, bad.message

    async def session() -> None:
        async with agent(server, "agent", [holes_model]) as client:
            begun = time.monotonic()
            nested = await call(client, "get_logs", run_id=run.run_id, pattern=r"(a+)+$")
            assert nested["pods"][0]["matched_lines"] == 1 and time.monotonic() - begun < MATCH_BUDGET_S
            begun = time.monotonic()
            text = await refused(client, "get_logs", run_id=bad.run_id, pattern=r"(a|a)+$")
            took = time.monotonic() - begun
            assert "took more than" in text and "give a simpler pattern" in text, text
            # The engine checks its timeout now and then, so it may stop a few hundredths before the budget.
            assert MATCH_BUDGET_S - 0.5 <= took < MATCH_BUDGET_S + 3, took
            assert _frames_in("_matches") == 0

    anyio.run(session)


SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"


def _cli_env(server, who: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMRUN_", "OTEL_"))}
    return env | {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": TOKENS[who]}


def _until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_an_abandoned_log_follower_ends_on_the_server(start_server, client_for, holes_model):
    """`simrun logs --follow` of a pod that prints one line and then nothing for two minutes, killed with SIGKILL:
    the server's follower notices the client went away within a poll and ends, while the pod still runs."""
    server = start_server()
    client = client_for(server, "agent")
    run_id = client.submit(write_workflow(holes_model, printer("started", quiet_s=120))).run_id
    follower = subprocess.Popen(
        [SIMRUN, "logs", run_id, "p", "--follow"], stdout=subprocess.PIPE, text=True, env=_cli_env(server, "agent")
    )
    try:
        assert follower.stdout is not None
        line = follower.stdout.readline()
        while "started" not in line:
            assert line, "the follower ended before the pod printed"
            line = follower.stdout.readline()
        _until(lambda: _frames_in("logs") > 0, 10, "no follower on the server")
        follower.kill()
        follower.wait(10)
        _until(lambda: _frames_in("logs") == 0, 10, "the server still follows the log of a client that is gone")
        assert client.get_run(run_id).state == common_pb2.RUN_STATE_RUNNING
    finally:
        follower.kill()
        follower.wait(10)
        if follower.stdout is not None:
            follower.stdout.close()
        client.cancel(run_id)


def test_environments_are_listed_to_those_who_may_read_a_run_of_them(
    start_server, client_for, tmp_path: Path, wheelhouse: Path
) -> None:
    """bob's agent and carol's agent each run a model with its own dependencies (two environments): `simrun envs`
    shows each agent its own, bob his agent's, and the owner both; no one learns of another's."""
    environments = EnvironmentsConfig(
        find_links=[str(wheelhouse)], no_index=True, uv_cache_dir=tmp_path / "uv-cache", compile_bytecode=False
    )
    server = start_server(environments=environments)
    bobs = make_trees(tmp_path / "bob")
    carols = make_trees(tmp_path / "carol")
    (carols / "pyproject.toml").write_text(model_pyproject("tinydep==2.0"))
    built = {}
    for who, model in (("agent", bobs), ("other-agent", carols)):
        client = client_for(server, who)
        run = wait_final(client, client.submit(model / "where.yaml").run_id)
        assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
        built[who] = run.environment
    assert len(set(built.values())) == 2

    def listed(who: str) -> set[str]:
        env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": TOKENS[who]}
        done = CliRunner().invoke(cli, ["envs", "--json"], env=env, catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return {e["environment_id"] for e in json.loads(done.output).get("environments", [])}

    assert listed("owner") >= {built["agent"], built["other-agent"]}
    assert listed("agent") == {built["agent"]}
    assert listed("person") == {built["agent"]}
    assert listed("other-agent") == {built["other-agent"]}
