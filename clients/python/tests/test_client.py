"""The typed client against a real embedded simrun: submit the montecarlo example, follow, list, compare, cancel."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import EXAMPLE, git_repo
from simrun.v1 import common_pb2
from simrun_client.client import FINAL_RUN_STATES, Client, git_toplevel, run_state
from simrun_core.config import EnvironmentsConfig, ServerConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound, SimrunError, Unauthenticated, Unavailable
from simrun_gateway.embedded import EmbeddedServer, start_embedded

SLOW_WORKFLOW = """\
name: slow
tasks:
  estimate:
    type: montecarlo.tasks:EstimatePi
    settings: {units: 400, samples_per_unit: 20000000}
"""


def copy_example(dest: Path) -> Path:
    """The montecarlo example as its own git repository (one commit), plus `slow.yaml` to cancel."""
    return git_repo(EXAMPLE, dest, {"slow.yaml": SLOW_WORKFLOW})


@dataclass(frozen=True)
class Served:
    """A running embedded simrun: where it listens, the owner's token, its store."""

    embedded: EmbeddedServer
    store: Path

    @property
    def endpoint(self) -> str:
        return self.embedded.address

    @property
    def token(self) -> str:
        return self.embedded.token


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example(tmp_path_factory.mktemp("model") / "montecarlo")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("home")
    config = ServerConfig(
        home=home,
        store=home / "store",
        address="127.0.0.1:0",
        grace_s=2,
        environments=EnvironmentsConfig(kind="server"),
    )
    embedded = start_embedded(config)
    try:
        yield Served(embedded, config.store)
    finally:
        embedded.stop()


@pytest.fixture(scope="module")
def client(server: Served) -> Iterator[Client]:
    with Client(server.endpoint, server.token) as client:
        yield client


@pytest.fixture(scope="module")
def pi_run(client: Client, model_repo: Path) -> common_pb2.Run:
    """The example's pi workflow, submitted from its working tree and followed to its end."""
    submitted = client.submit(model_repo / "pi.yaml", group="client-tests")
    assert submitted.state == common_pb2.RUN_STATE_SUBMITTING
    return client.wait(submitted.run_id)


def test_identity_is_the_owner(client: Client) -> None:
    identity = client.identity()
    assert identity.kind == "owner"
    assert identity.priority == common_pb2.PRIORITY_OWNER


def test_the_pi_workflow_succeeds_with_its_summaries(client: Client, pi_run: common_pb2.Run) -> None:
    assert pi_run.state == common_pb2.RUN_STATE_SUCCEEDED, pi_run.message
    assert [task.task_id for task in pi_run.tasks] == ["estimate", "report"]
    estimate = pi_run.tasks[0]
    assert estimate.split and estimate.units == 16 and estimate.units_done == 16
    assert pi_run.snapshots[0].provenance.branch == "main"
    comparison = client.compare(run_ids=[pi_run.run_id])
    values = {(row.task_id, row.key): json.loads(row.values[0]) for row in comparison.rows}
    assert abs(values["estimate", "pi"] - 3.14159) < 0.01
    assert values["estimate", "samples"] == 16 * 500_000
    assert values["report", "consistent"] is True


def test_watch_ends_with_the_final_run(client: Client, pi_run: common_pb2.Run) -> None:
    updates = list(client.watch(pi_run.run_id))
    assert updates[-1].run.state == common_pb2.RUN_STATE_SUCCEEDED
    progress = {p.task_id: p for p in updates[-1].progress}
    assert progress["estimate"].units == progress["estimate"].units_done == 16


def test_get_and_list_find_the_run(client: Client, pi_run: common_pb2.Run) -> None:
    assert client.get_run(pi_run.run_id).run_id == pi_run.run_id
    assert pi_run.run_id in [run.run_id for run in client.list_runs(group="client-tests")]
    assert pi_run.run_id in [run.run_id for run in client.list_runs(state="succeeded")]
    assert pi_run.run_id not in [run.run_id for run in client.list_runs(state=common_pb2.RUN_STATE_FAILED)]
    assert client.list_runs(group="no-such-group") == []


def test_list_reads_every_page(client: Client, model_repo: Path, pi_run: common_pb2.Run) -> None:
    second = client.wait(client.submit(model_repo / "pi.yaml", group="client-tests").run_id)
    ids = [run.run_id for run in client.list_runs(group="client-tests", page_size=1)]
    assert {pi_run.run_id, second.run_id} <= set(ids)
    assert len(ids) == len(set(ids))


def test_logs_of_a_task(client: Client, pi_run: common_pb2.Run) -> None:
    chunks = list(client.logs(pi_run.run_id, "estimate", worker="w0"))
    assert chunks and all(chunk.pod.startswith("w0") for chunk in chunks)


def test_estimate_plans_each_task(client: Client, model_repo: Path) -> None:
    result = client.estimate(model_repo / "pi.yaml", single_server=True)
    assert [task.task_id for task in result.tasks] == ["estimate", "report"]
    assert result.tasks[0].plan.units == 16 and result.tasks[0].plan.pods == 1


def test_nodes_are_this_machine_by_default(client: Client) -> None:
    assert [(node.cores, node.reserved_by) for node in client.nodes()] == [(os.cpu_count(), "")]


def test_an_unknown_setting_is_refused_by_name(client: Client, model_repo: Path, tmp_path: Path) -> None:
    workflow = model_repo / "typo.yaml"
    workflow.write_text(
        "tasks:\n  estimate:\n    type: montecarlo.tasks:EstimatePi\n    settings: {sample_per_unit: 10}\n"
    )
    try:
        with pytest.raises(InvalidArgument, match="sample_per_unit"):
            client.submit(workflow)
    finally:
        workflow.unlink()


def test_a_bad_workflow_is_refused_before_snapshotting(client: Client, tmp_path: Path) -> None:
    workflow = tmp_path / "bad.yaml"
    workflow.write_text("tasks: {a: {type: x:Y, inputs: {i: nope.out}}}\n")
    with pytest.raises(InvalidArgument, match="no task 'nope'"):
        client.submit(workflow)


def test_a_workflow_outside_git_needs_a_model(client: Client, model_repo: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    shutil.copytree(model_repo, loose, ignore=shutil.ignore_patterns(".git"))
    with pytest.raises(InvalidArgument, match="not in a git working tree"):
        client.submit(loose / "pi.yaml")


def test_a_model_given_explicitly_and_a_mounted_store(
    client: Client, server: Served, model_repo: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "pi.yaml"
    shutil.copy(model_repo / "pi.yaml", elsewhere)
    (model_repo / "uncommitted.txt").write_text("a change\n")
    try:
        run = client.submit(elsewhere, model=model_repo, store=server.store, group="client-tests")
    finally:
        (model_repo / "uncommitted.txt").unlink()
    snapshot = run.snapshots[0]
    assert snapshot.provenance.dirty and "uncommitted.txt" in snapshot.provenance.changed_files
    assert (server.store / snapshot.path / "uncommitted.txt").read_text() == "a change\n"
    assert client.wait(run.run_id).state == common_pb2.RUN_STATE_SUCCEEDED


def test_cancel_stops_a_running_run(client: Client, model_repo: Path) -> None:
    run = client.submit(model_repo / "slow.yaml")
    # A bounded wait returns the run as it is when the time is up, not yet ended; a bounded watch just stops.
    waited = client.wait(run.run_id, timeout_s=0.5)
    assert waited.run_id == run.run_id and waited.state not in FINAL_RUN_STATES
    updates = list(client.watch(run.run_id, timeout_s=0.5))
    assert updates and all(u.run.state not in FINAL_RUN_STATES for u in updates)
    client.cancel(run.run_id)
    final = client.wait(run.run_id)
    assert final.state == common_pb2.RUN_STATE_CANCELLED
    with pytest.raises(FailedPrecondition):
        client.cancel(run.run_id)


def test_an_unknown_run_is_not_found(client: Client) -> None:
    with pytest.raises(NotFound):
        client.get_run("no-such-run")
    with pytest.raises(NotFound):
        list(client.watch("no-such-run"))


def test_a_wrong_token_is_unauthenticated(server: Served) -> None:
    with Client(server.endpoint, "not-a-token") as client, pytest.raises(Unauthenticated):
        client.identity()


def test_no_token_says_where_one_comes_from(server: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMRUN_TOKEN", raising=False)
    monkeypatch.setenv("SIMRUN_HOME", str(tmp_path))
    with Client(server.endpoint) as client, pytest.raises(Unauthenticated, match="where `simrun server` writes one"):
        client.identity()


def test_an_endpoint_nobody_listens_at_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    with Client(endpoint, "t") as client, pytest.raises(Unavailable) as caught:
        client.get_run("r")
    assert str(caught.value) == f"cannot reach simrun at {endpoint}: start it with `simrun server`"


def test_run_state_names() -> None:
    assert run_state("running") == run_state("RUN_STATE_RUNNING") == common_pb2.RUN_STATE_RUNNING
    assert common_pb2.RUN_STATE_CANCELLED in FINAL_RUN_STATES
    with pytest.raises(InvalidArgument, match="one of submitting"):
        run_state("done")


def test_git_toplevel_of_a_file_in_a_subfolder(model_repo: Path) -> None:
    assert git_toplevel(model_repo / "montecarlo" / "tasks.py") == model_repo.resolve()


def test_quick_start_reads_what_grpcio_reads(
    server: Served, client: Client, pi_run: common_pb2.Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's own connection (`quick_start`) against the real simrun: each read answers as grpcio's channel
    does, and each refusal is the same error in the same words; only a stream opens grpcio's channel."""
    # This process serves simrun too, so OpenTelemetry is loaded here and a client would trace its calls through
    # grpcio; the CLI's process, which this stands for, has not loaded it.
    monkeypatch.setattr("simrun_core.telemetry_env.may_record", lambda env=None: False)
    with Client(server.endpoint, server.token, quick_start=True) as quick:
        assert quick._unary is not None
        assert quick.identity() == client.identity()
        assert quick.get_run(pi_run.run_id) == client.get_run(pi_run.run_id)
        assert quick.list_runs(group="client-tests", page_size=1) == client.list_runs(group="client-tests")
        assert quick.compare(run_ids=[pi_run.run_id]) == client.compare(run_ids=[pi_run.run_id])
        assert quick.nodes() == client.nodes()
        assert quick.outputs(pi_run.run_id) == client.outputs(pi_run.run_id)
        for failing in (lambda c: c.get_run("no-such-run"), lambda c: c.cancel(pi_run.run_id)):
            errors = []
            for each in (quick, client):
                with pytest.raises(SimrunError) as caught:
                    failing(each)
                errors.append((type(caught.value), str(caught.value)))
            assert errors[0] == errors[1]
        assert quick._grpc_channel is None
        assert list(quick.watch(pi_run.run_id))[-1].run.state == common_pb2.RUN_STATE_SUCCEEDED
        assert quick._grpc_channel is not None
    with Client(server.endpoint, "not-a-token", quick_start=True) as stranger, pytest.raises(Unauthenticated):
        stranger.identity()
