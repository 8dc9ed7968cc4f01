"""`simrun` against a real embedded simrun: submit and follow the montecarlo example, read it back every way."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

Invoke = Callable[..., Result]


@pytest.fixture(scope="session")
def watched(invoke: Invoke, model_repo: Path) -> tuple[Result, str]:
    """`simrun submit pi.yaml --watch`: its output and the run's id."""
    result = invoke("submit", model_repo / "pi.yaml", "--group", "cli-tests", "--watch")
    match = re.search(r"submitted run (\S+)", result.stdout)
    assert match, result.output
    return result, match.group(1)


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def test_submit_watch_shows_progress_then_the_summaries(watched: tuple[Result, str]) -> None:
    result, run_id = watched
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert re.search(r"^\d\d:\d\d:\d\d estimate succeeded 16/16 units$", out, re.MULTILINE), out
    assert f"run {run_id}  succeeded" in out
    assert "summaries" in out
    assert re.search(r"estimate\s+pi\s+3\.14", out), out
    assert re.search(r"report\s+consistent\s+true", out), out


def test_status_json_is_the_run(invoke: Invoke, watched: tuple[Result, str]) -> None:
    _, run_id = watched
    result = invoke("status", run_id, "--json")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert run["run_id"] == run_id and run["state"] == "RUN_STATE_SUCCEEDED"
    assert [(t["task_id"], t.get("units")) for t in run["tasks"]] == [("estimate", 16), ("report", None)]


def test_status_for_people(invoke: Invoke, watched: tuple[Result, str]) -> None:
    _, run_id = watched
    result = invoke("status", run_id)
    assert result.exit_code == 0, result.output
    assert "montecarlo.tasks:EstimatePi" in result.stdout and "16/16" in result.stdout
    assert re.search(r"estimate\s+samples\s+8000000", result.stdout), result.stdout


def test_list_filters_by_group_and_state(invoke: Invoke, watched: tuple[Result, str]) -> None:
    _, run_id = watched
    listed = json.loads(invoke("list", "--group", "cli-tests", "--json").stdout)
    assert run_id in [run["run_id"] for run in listed["runs"]]
    table = invoke("list", "--state", "succeeded").stdout
    assert run_id in table and "cli-tests" in table
    assert run_id not in invoke("list", "--state", "failed", "--json").stdout
    assert invoke("list", "--group", "nobody").stdout == "no runs\n"


def test_compare_runs_and_groups(invoke: Invoke, watched: tuple[Result, str]) -> None:
    _, run_id = watched
    comparison = json.loads(invoke("compare", run_id, "--json").stdout)
    assert comparison["run_ids"] == [run_id]
    rows = {(row["task_id"], row["key"]): row["values"] for row in comparison["rows"]}
    assert json.loads(rows["estimate", "samples"][0]) == 8_000_000
    table = invoke("compare", "--group", "cli-tests").stdout
    assert run_id in table and "abs_error" in table


def test_compare_needs_runs_or_a_group(invoke: Invoke) -> None:
    result = invoke("compare")
    assert result.exit_code == 2 and "give the runs to compare, or --group" in result.stderr


def test_estimate(invoke: Invoke, model_repo: Path) -> None:
    result = invoke("estimate", model_repo / "pi.yaml", "--single-server", "--json")
    assert result.exit_code == 0, result.output
    tasks = json.loads(result.stdout)["tasks"]
    assert [t["task_id"] for t in tasks] == ["estimate", "report"]
    assert tasks[0]["plan"]["units"] == 16 and tasks[0]["plan"]["pods"] == 1
    table = invoke("estimate", model_repo / "pi.yaml").stdout
    assert re.search(r"estimate\s+\d+\s", table), table


def test_logs_of_the_coordinator(invoke: Invoke, watched: tuple[Result, str]) -> None:
    _, run_id = watched
    result = invoke("logs", run_id, "estimate", "--worker", "w0")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and not result.stdout.startswith("==>")
    every_pod = invoke("logs", run_id, "estimate").stdout
    assert every_pod.startswith("==> w0")


def test_cancel_then_status_watch_fails_with_the_state(invoke: Invoke, model_repo: Path) -> None:
    submitted = invoke("submit", model_repo / "slow.yaml", "--json")
    assert submitted.exit_code == 0, submitted.output
    run = json.loads(submitted.stdout)
    assert run["state"] == "RUN_STATE_SUBMITTING"
    cancelled = invoke("cancel", run["run_id"])
    assert cancelled.exit_code == 0 and cancelled.stdout.startswith(f"cancelled run {run['run_id']}")
    followed = invoke("status", run["run_id"], "--watch")
    assert _one_error_line(followed).startswith(f"Error: run {run['run_id']} cancelled")
    again = invoke("cancel", run["run_id"])
    assert "Traceback" not in _one_error_line(again)


def test_a_failing_task_fails_the_run_and_says_why(invoke: Invoke, model_repo: Path) -> None:
    workflow = model_repo / "broken.yaml"
    workflow.write_text(
        "tasks:\n"
        "  scan: {type: montecarlo.tasks:ConvergenceScan, settings: {points: 2, min_samples: 100}}\n"
        "  report: {type: montecarlo.tasks:Report, inputs: {estimate: scan.scan}}\n"
    )
    try:
        result = invoke("submit", workflow, "--watch")
    finally:
        workflow.unlink()
    line = _one_error_line(result)
    run_id = re.search(r"submitted run (\S+)", result.stdout).group(1)  # type: ignore[union-attr]
    assert line.startswith(f"Error: run {run_id} failed") and line.endswith(f"see `simrun logs {run_id} report`")
    assert re.search(r"report\s.*failed", result.stdout), result.stdout
    run = json.loads(invoke("status", run_id, "--json").stdout)
    states = {task["task_id"]: task["state"] for task in run["tasks"]}
    assert states == {"scan": "TASK_STATE_SUCCEEDED", "report": "TASK_STATE_FAILED"}


def test_a_misspelled_setting_is_one_line(invoke: Invoke, model_repo: Path) -> None:
    workflow = model_repo / "typo.yaml"
    workflow.write_text("tasks:\n  e:\n    type: montecarlo.tasks:EstimatePi\n    settings: {sample_per_unit: 3}\n")
    try:
        line = _one_error_line(invoke("submit", workflow))
    finally:
        workflow.unlink()
    assert "sample_per_unit" in line and "samples_per_unit" in line


def test_an_unknown_run(invoke: Invoke) -> None:
    assert "no-such-run" in _one_error_line(invoke("status", "no-such-run"))


def test_whoami(invoke: Invoke) -> None:
    assert re.match(r"\S+ \(owner\), priority owner", invoke("whoami").stdout)
    assert json.loads(invoke("whoami", "--json").stdout)["priority"] == "PRIORITY_OWNER"


def test_snapshot_into_a_mounted_store_then_uploaded(
    invoke: Invoke, model_repo: Path, server: object, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    mounted = invoke("snapshot", model_repo, "--store", store)
    assert mounted.exit_code == 0, mounted.output
    written = json.loads(mounted.stdout)
    assert written["name"] == "montecarlo" and written["provenance"]["branch"] == "main"
    assert (store / written["path"] / "pi.yaml").is_file()
    uploaded = json.loads(invoke("snapshot", model_repo).stdout)
    assert uploaded["snapshot_id"] == written["snapshot_id"]


def test_submit_needs_an_existing_workflow(invoke: Invoke, tmp_path: Path) -> None:
    result = invoke("submit", tmp_path / "missing.yaml")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_submit_with_the_same_request_id_returns_the_first_run(invoke: Invoke, model_repo: Path) -> None:
    first = invoke("submit", model_repo / "slow.yaml", "--request-id", "cli-retry-1", "--json")
    second = invoke("submit", model_repo / "slow.yaml", "--request-id", "cli-retry-1", "--json")
    try:
        assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
        assert json.loads(second.stdout)["run_id"] == json.loads(first.stdout)["run_id"]
    finally:
        for result in (first, second):
            if result.exit_code == 0:
                invoke("cancel", json.loads(result.stdout)["run_id"])


TINY = """\
name: tiny
group: nested
tasks:
  estimate:
    type: montecarlo.tasks:EstimatePi
    settings: {{units: 4, samples_per_unit: 1000, seed: {seed}}}
"""


@pytest.fixture(scope="session")
def nested(invoke: Invoke, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Result]]:
    """The example as a folder of a larger git working tree (as in simrun's own), submitted twice, two seeds."""
    import shutil
    import subprocess

    from e2e_support import EXAMPLE

    top = tmp_path_factory.mktemp("outer")
    model = top / "examples" / "montecarlo"
    shutil.copytree(EXAMPLE, model, ignore=shutil.ignore_patterns("__pycache__", ".venv", "tests"))
    for seed in (1, 2):
        (model / f"tiny{seed}.yaml").write_text(TINY.format(seed=seed))
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "outer"]):
        subprocess.run(["git", *args], cwd=top, check=True, capture_output=True, env={**env, "PATH": "/usr/bin:/bin"})
    return model, [invoke("submit", model / f"tiny{seed}.yaml", "--watch") for seed in (1, 2)]


def test_submit_takes_the_model_folder_below_the_git_top(nested: tuple[Path, list[Result]]) -> None:
    _, results = nested
    for result in results:
        assert result.exit_code == 0, result.output
        # Off a terminal, --watch prints a line per change rather than nothing until the end.
        assert re.search(r"^\d\d:\d\d:\d\d estimate (queued|running|succeeded)", result.stdout, re.MULTILINE)
        assert "succeeded 4/4 units" in result.stdout


def test_compare_shows_the_settings_that_differ(invoke: Invoke, nested: tuple[Path, list[Result]]) -> None:
    table = invoke("compare", "--group", "nested")
    assert table.exit_code == 0, table.output
    assert re.search(r"estimate\s+settings\.seed\s+\d\s+\d", table.stdout), table.stdout
    assert "settings.units" not in table.stdout and "…" not in table.stdout
    data = json.loads(invoke("compare", "--group", "nested", "--json").stdout)
    settings = [(s["task_id"], s["key"], sorted(s["values"])) for s in data["settings"]]
    assert settings == [("estimate", "seed", ["1", "2"])]
    assert {row["key"] for row in data["rows"]} >= {"pi", "samples"}


def test_estimate_says_unknown_for_seconds_not_learned(invoke: Invoke, tmp_path: Path) -> None:
    # A model of its own name: what other tests ran of the example is learned for the example, not for it. Its
    # content is the example's, so without `--reuse never` it would reuse what they ran (seconds 0, not unknown).
    from e2e_support import EXAMPLE, git_repo

    fresh = git_repo(EXAMPLE, tmp_path / "never-ran")
    table = invoke("estimate", fresh / "pi.yaml", "--reuse", "never").stdout
    assert re.search(r"^\s*report\s.*unknown\s*$", table, re.MULTILINE), table
    assert "0.0 " not in table


def test_a_token_with_a_newline_is_one_line(invoke: Invoke) -> None:
    line = _one_error_line(invoke("whoami", "--token", "abc\ndef"))
    assert "newline" in line


def test_logs_of_one_unit_are_its_prefixed_lines() -> None:
    from simrun_cli.main import unit_lines

    lines = "[unit 1] a\n[unit 12] b\nplain\n[unit 1] c\n"
    assert unit_lines(lines, 1) == "a\nc\n"
    assert unit_lines(lines, 12) == "b\n"
    assert unit_lines(lines, 3) == ""


def test_outputs_list_the_files_with_their_store_paths(invoke: Invoke, watched: tuple[Result, str], server) -> None:
    _, run_id = watched
    table = invoke("outputs", run_id)
    assert table.exit_code == 0, table.output
    assert re.search(r"estimate\s+estimate\s+estimate\.json\s+\d+ B\s+runs/\S+/estimate\.json", table.stdout), (
        table.stdout
    )
    listed = json.loads(invoke("outputs", run_id, "estimate", "estimate", "--json").stdout)["files"]
    assert [f["path"] for f in listed] == ["estimate.json"]
    in_store = server.config.store / listed[0]["store_path"]
    assert in_store.stat().st_size == int(listed[0]["size_bytes"])
    status = json.loads(invoke("status", run_id, "--json").stdout)
    ports = {task["task_id"]: task.get("outputs") for task in status["tasks"]}
    assert ports["estimate"] == {"estimate": f"runs/{run_id}/tasks/estimate/out/estimate"}


def test_fetch_copies_a_port_through_the_gateway(
    invoke: Invoke, watched: tuple[Result, str], server, tmp_path: Path
) -> None:
    _, run_id = watched
    dest = tmp_path / "got"
    fetched = invoke("fetch", run_id, "estimate", "estimate", dest)
    assert fetched.exit_code == 0, fetched.output
    assert fetched.stdout.startswith("fetched 1 file (") and str(dest) in fetched.stdout
    source = server.config.store / "runs" / run_id / "tasks" / "estimate" / "out" / "estimate" / "estimate.json"
    assert (dest / "estimate.json").read_bytes() == source.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["got"], "nothing staged is left beside DEST"
    assert "no output 'nope'" in _one_error_line(invoke("fetch", run_id, "estimate", "nope", dest))
    assert "not an output port name" in _one_error_line(invoke("fetch", run_id, "estimate", "..", dest))


SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"

SERVER_SIDE = ("simrun_gateway", "simrun_tracker", "simrun_planner", "simrun_learner", "simrun_snapshot")
"""Packages only `simrun server` (and `simrun render`) may load."""


def imported_by(args: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    """The modules the real `simrun ARGS…` process imported (`python -X importtime` names each one), and its stdout."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", SIMRUN, *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return names, done.stdout


def loaded(names: set[str], *packages: str) -> set[str]:
    """The modules of `names` that are one of `packages` or in one of them."""
    return {name for name in names if any(name == p or name.startswith(f"{p}.") for p in packages)}


def test_read_commands_start_without_what_they_do_not_use(watched: tuple[Result, str], server) -> None:
    """Each command as a process imports what it calls and draws: `--version` no grpc, a read no server side, no
    pydantic (it is for configs), no OpenTelemetry unless a variable asks for spans, rich only for live bars, and
    grpcio only for a stream (`logs`) or spans: unary calls go on the client's own HTTP/2 connection."""
    _, run_id = watched
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMRUN_", "OTEL_"))}
    env |= {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": server.token}
    never: tuple[str, ...] = (*SERVER_SIDE, "pydantic", "yaml", "opentelemetry", "simrun_core.config")
    never += ("simrun_core.telemetry", "simrun.v1.learner_pb2", "simrun.v1.snapshot_pb2", "simrun.v1.planner_pb2")
    never += ("simrun.v1.envbuilder_pb2",)

    version, out = imported_by(["--version"], env)
    assert out.startswith("simrun, version ")
    assert not loaded(version, "grpc", "google", "rich", "simrun", "simrun_client", *never), sorted(version)

    status, out = imported_by(["status", run_id], env)
    assert f"run {run_id}  succeeded" in out and "summaries" in out
    assert {"simrun_client.unary", "simrun.v1.tracker_pb2", "simrun_cli.tables"} <= status
    # rich is for --watch's live bars, the JSON printer for --json, the gateway's messages for whoami.
    never_unary = (*never, "grpc", "simrun.v1.tracker_pb2_grpc")
    assert not loaded(status, *never_unary, "rich", "google.protobuf.json_format", "simrun.v1.gateway_pb2")

    as_json, out = imported_by(["status", run_id, "--json"], env)
    assert json.loads(out)["run_id"] == run_id
    assert not loaded(as_json, *never_unary, "rich"), sorted(loaded(as_json, "grpc", "rich"))

    for args in (["whoami"], ["list", "--json"], ["outputs", run_id, "--json"]):
        names, out = imported_by(args, env)
        assert out.strip(), args
        assert not loaded(names, *never_unary, "rich"), (args, sorted(loaded(names, *never_unary, "rich")))
    logs, out = imported_by(["logs", run_id, "report"], env)
    assert out.strip() and "grpc" in logs and not loaded(logs, *never, "rich"), sorted(loaded(logs, *never, "rich"))
    for args in (["list"], ["outputs", run_id]):
        names, out = imported_by(args, env)
        assert run_id in out, (args, out)
        assert not loaded(names, *never_unary, "rich"), (args, sorted(loaded(names, *never_unary, "rich")))
    compared, out = imported_by(["compare", run_id], env)  # it reads the runs' workflows (pydantic) for settings
    assert run_id in out and not loaded(compared, "grpc", "rich"), sorted(loaded(compared, "grpc", "rich"))

    # Where a variable asks for spans, the command records them (on stderr here): OpenTelemetry is loaded then,
    # and the calls go through grpcio's channel, which the spans instrument.
    traced, _ = imported_by(["whoami"], {**env, "OTEL_TRACES_EXPORTER": "console"})
    assert {"opentelemetry.sdk.trace", "simrun_core.telemetry", "grpc"} <= traced


def test_text_from_a_run_is_drawn_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """A summary value, its key or a task's name is printed as written: no rich markup or emoji code in it takes
    effect in `simrun compare`, and no escape sequence a task chose reaches the terminal from it or `simrun status`."""
    from simrun.v1 import common_pb2, tracker_pb2
    from simrun_cli import render

    attack = "\x1b]52;c;aGk=\x07\x1b[2J\x9b31m"
    row = tracker_pb2.ComparisonRow(
        task_id="[bold]t[/bold]", key=f"k{attack}", values=[json.dumps(f"[red]on :fire:{attack}")]
    )
    comparison = tracker_pb2.CompareRunsResponse(run_ids=["r1"], rows=[row])
    task = common_pb2.Task(task_id="a:smile:b", type="m.tasks:[i]T[/i]", message=attack)
    run = common_pb2.Run(run_id="r1", tasks=[task], message=attack, state=common_pb2.RUN_STATE_FAILED)
    render.echo(render.comparison_table(comparison))
    render.show(run, comparison)
    printed = capsys.readouterr().out
    assert "[bold]t[/bold]" in printed and "[red]on :fire:" in printed, printed
    assert "a:smile:b" in printed and "m.tasks:[i]T[/i]" in printed, printed
    assert not any(c in printed for c in "\x1b\x07\x9b"), printed
    assert printed.count("\\x1b]52;c;aGk=\\x07") == 6, printed  # key and value twice, run and task messages
