"""Attacks on a real server by an identity of the same machine: an agent's token, a task of one's own, the stubs.

Each attack is refused or contained with a clear message, and the victim's data is byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e_support import E2E_MODEL, git_repo, wait_final, write_workflow
from simrun.v1 import common_pb2, learner_pb2, learner_pb2_grpc, snapshot_pb2, snapshot_pb2_grpc
from simrun_client.client import Client
from simrun_core.config import Limits, NodeConfig, ServerConfig, TlsConfig
from simrun_core.errors import FailedPrecondition, InvalidArgument, PermissionDenied, ResourceExhausted, Unavailable
from simrun_core.identity import add_token
from simrun_gateway.embedded import EmbeddedServer, start_embedded
from simrun_runtime.confine import landlock_abi
from tls_support import make_certificates

SLOW = """
name: slow
tasks:
  values:
    type: e2etasks.tasks:Slow
    settings: {units: 4, seconds: 0.05, seed: 3}
"""


def fingerprint(*roots: Path) -> dict[str, tuple[str, int]]:
    """Every file under `roots` with the SHA-256 of its bytes and its mode: equal means untouched."""
    found: dict[str, tuple[str, int]] = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        for path in paths:
            found[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), stat.S_IMODE(path.stat().st_mode))
    return found


class Machine:
    """A server with its own home (the owner's token made on first start) and people and agents added to it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.home = tmp_path / "home"
        self.servers: list[EmbeddedServer] = []
        self.clients: list[Client] = []
        self.tokens: dict[str, str] = {}

    def start(self, **settings: object) -> EmbeddedServer:
        config = ServerConfig(
            home=settings.pop("home", self.home),  # type: ignore[arg-type]
            store=settings.pop("store", self.home / "store"),  # type: ignore[arg-type]
            address=settings.pop("address", "127.0.0.1:0"),  # type: ignore[arg-type]
            nodes=[NodeConfig(name="node-a", cores=2, memory_gb=8)],
            grace_s=5,
            **settings,  # type: ignore[arg-type]
        )
        server = start_embedded(config)
        self.servers.append(server)
        if server.token and "owner" not in self.tokens:
            self.tokens["owner"] = server.token
            tokens_file = config.home / "tokens.yaml"
            self.tokens["person"] = add_token(tokens_file, "bob")[0]
            self.tokens["agent"] = add_token(tokens_file, "bob-agent", agent_of="bob")[0]
        return server

    def client(self, server: EmbeddedServer, who: str, **kwargs: object) -> Client:
        client = Client(server.address, self.tokens[who], **kwargs)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop()


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    m = Machine(tmp_path)
    yield m
    m.stop()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return git_repo(E2E_MODEL, tmp_path / "e2e-model")


# --- the home and store at rest ------------------------------------------------------------------------------


def test_the_home_and_store_are_closed_to_other_local_accounts(machine: Machine, model: Path) -> None:
    server = machine.start()
    owner = machine.client(server, "owner")
    run = wait_final(owner, owner.submit(write_workflow(model, SLOW)).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED
    home, store = machine.home, machine.home / "store"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE(store.stat().st_mode) == 0o700
    for name in ("tokens.yaml", "token"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
    assert machine.tokens["owner"] not in (home / "tokens.yaml").read_text()
    runuser = shutil.which("runuser")
    if os.geteuid() != 0 or runuser is None:
        return
    summary = next(store.rglob("summary.json"))
    snapshot_file = next(p for p in (store / "snapshots").rglob("*.py"))
    for path in (home / "tokens.yaml", home / "token", summary, snapshot_file):
        other = subprocess.run([runuser, "-u", "nobody", "--", "cat", str(path)], capture_output=True, text=True)
        assert other.returncode != 0 and "Permission denied" in other.stderr, path


# --- the learner ---------------------------------------------------------------------------------------------


def test_an_agent_cannot_poison_the_learner_and_the_owner_can_forget(machine: Machine) -> None:
    server = machine.start()
    key = common_pb2.ObservationKey(task_type="e2etasks.tasks:Slow", model="e2e-model")
    hint = common_pb2.ResolvedResources(base_memory_gb=0.25, per_worker_gb=0.25, cores_per_process=1)
    agent = learner_pb2_grpc.ResourceLearnerServiceStub(machine.client(server, "agent").channel)
    for _ in range(20):
        with pytest.raises(grpc.RpcError) as info:
            agent.CreateObservation(
                learner_pb2.CreateObservationRequest(
                    observation=common_pb2.Observation(key=key, per_worker_gb=56, succeeded=True, run_id="x")
                )
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    resolved = agent.ResolveResources(learner_pb2.ResolveResourcesRequest(key=key, hint=hint)).resources
    assert resolved.per_worker_gb == 0.25 and resolved.rule == common_pb2.RESOLUTION_RULE_HINT
    assert machine.client(server, "owner").forget_observations(key.task_type, key.model) == 0
    with pytest.raises(PermissionDenied, match="only the cluster's owner may"):
        machine.client(server, "agent").forget_observations(key.task_type, key.model)


# --- uploads -------------------------------------------------------------------------------------------------


def test_an_oversized_upload_is_refused_and_writes_nothing(machine: Machine, model: Path) -> None:
    server = machine.start(limits=Limits(upload_bytes=64 * 1024))
    (model / "data.bin").write_bytes(os.urandom(256 * 1024))
    agent = machine.client(server, "agent")
    with pytest.raises(InvalidArgument, match=r"more than the 65536 this server takes \(limits.upload_bytes\)"):
        agent.snapshot(model)
    snapshots = machine.home / "store" / "snapshots"
    assert not snapshots.exists() or not any(p.is_file() and ".tmp-" not in str(p) for p in snapshots.rglob("*"))


def test_a_path_component_too_long_is_invalid_argument_not_internal(machine: Machine) -> None:
    server = machine.start()
    stub = snapshot_pb2_grpc.SnapshotServiceStub(machine.client(server, "agent").channel)
    entry = common_pb2.FileEntry(path="pkg/" + "n" * 300, sha256="0" * 64, size=1)
    with pytest.raises(grpc.RpcError) as info:
        stub.FindMissingContents(snapshot_pb2.FindMissingContentsRequest(name="m", files=[entry]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "component of 300 bytes, more than the 255" in (info.value.details() or "")


# --- one server per home, per address ------------------------------------------------------------------------


def test_a_second_server_on_the_same_home_is_refused_naming_the_first(machine: Machine) -> None:
    machine.start()
    with pytest.raises(FailedPrecondition, match=rf"another simrun server \(pid {os.getpid()}\) uses the home"):
        machine.start()


def test_a_second_server_on_the_same_address_is_refused(machine: Machine, tmp_path: Path) -> None:
    first = machine.start()
    other = tmp_path / "other-home"
    with pytest.raises(OSError, match="cannot bind"):
        machine.start(home=other, store=other / "store", address=first.address)
    # The refused server left its home free: a server can start there at once.
    machine.start(home=other, store=other / "store")


# --- transport -----------------------------------------------------------------------------------------------


def test_plaintext_beyond_loopback_is_refused_unless_insecure(machine: Machine) -> None:
    with pytest.raises(InvalidArgument, match=r"refusing to serve plaintext on 0\.0\.0\.0:0"):
        machine.start(address="0.0.0.0:0")


def test_tls_clients_and_plaintext_clients_do_not_mix(machine: Machine, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    tls_server = machine.start(tls=TlsConfig(cert=certs.server_cert, key=certs.server_key))
    assert machine.client(tls_server, "owner", tls_ca=certs.ca).identity().name
    with pytest.raises(Unavailable):
        machine.client(tls_server, "owner", timeout_s=5).identity()
    other = tmp_path / "plain-home"
    plain = machine.start(home=other, store=other / "store")
    plain_client = Client(plain.address, plain.token, tls_ca=certs.ca, timeout_s=5)
    machine.clients.append(plain_client)
    with pytest.raises(Unavailable):
        plain_client.identity()


def test_mutual_tls_needs_a_client_certificate(machine: Machine, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    server = machine.start(
        tls=TlsConfig(cert=certs.server_cert, key=certs.server_key, client_ca=certs.ca), address="localhost:0"
    )
    with pytest.raises(Unavailable):
        machine.client(server, "owner", tls_ca=certs.ca, timeout_s=5).identity()
    good = machine.client(server, "owner", tls_ca=certs.ca, tls_cert=certs.client_cert, tls_key=certs.client_key)
    assert good.identity().kind == "owner"


# --- user code at describe time ------------------------------------------------------------------------------

SNOOP = """
from pathlib import Path
from simrun_runtime import SplitTaskType, TaskSettings

SECRET = Path({secret!r})
try:
    LOOT = SECRET.read_text()
except OSError as exc:
    LOOT = type(exc).__name__
raise ImportError("loot: " + LOOT)
"""


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_task_types_import_cannot_read_the_tokens(machine: Machine, model: Path) -> None:
    server = machine.start()
    for secret in (machine.home / "tokens.yaml", machine.home / "token"):
        (model / "e2etasks" / "snoop.py").write_text(SNOOP.format(secret=str(secret)))
        workflow = write_workflow(model, "name: snoop\ntasks:\n  t:\n    type: e2etasks.snoop:Snoop\n")
        with pytest.raises(InvalidArgument) as info:
            machine.client(server, "agent").submit(workflow)
        assert "loot: PermissionError" in str(info.value)
        assert machine.tokens["owner"] not in str(info.value) and "sha256:" not in str(info.value)


# Attacks by tasks (pods) and through the tracker's read side follow in `test_attacks_tasks.py`.


def test_snapshot_listings_and_provenance_follow_the_read_policy(machine: Machine, model: Path) -> None:
    server = machine.start()
    owner_snapshot = machine.client(server, "owner").snapshot(model).snapshot
    agent = snapshot_pb2_grpc.SnapshotServiceStub(machine.client(server, "agent").channel)
    listed = agent.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(name=owner_snapshot.name)).snapshots
    assert list(listed) == []
    # Naming the content id is having the content: the snapshot is found, without the owner's branch and changes.
    found = agent.GetSnapshot(
        snapshot_pb2.GetSnapshotRequest(name=owner_snapshot.name, snapshot_id=owner_snapshot.snapshot_id)
    ).snapshot
    assert found.snapshot_id == owner_snapshot.snapshot_id
    assert not found.provenance.branch and not found.provenance.commit
    owner = snapshot_pb2_grpc.SnapshotServiceStub(machine.client(server, "owner").channel)
    listed = owner.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(name=owner_snapshot.name)).snapshots
    assert [s.snapshot_id for s in listed] == [owner_snapshot.snapshot_id]
    assert listed[0].provenance.branch == "main"


def test_one_identity_cannot_hold_every_call_the_server_serves(machine: Machine, model: Path) -> None:
    """Streams hold one of the server's bounded calls while open: one agent's watches must not starve the others."""
    from simrun.v1 import tracker_pb2, tracker_pb2_grpc

    server = machine.start(limits=Limits(calls_per_identity=3))
    agent = machine.client(server, "agent")
    run = agent.submit(write_workflow(model, SLOW.replace("seconds: 0.05", "seconds: 1.5")))
    stub = tracker_pb2_grpc.RunTrackerServiceStub(agent.channel)
    watches = [stub.WatchRun(tracker_pb2.WatchRunRequest(run_id=run.run_id)) for _ in range(3)]
    for watch in watches:
        next(watch)  # each stream is open on the server
    with pytest.raises(grpc.RpcError) as info:
        stub.GetRun(tracker_pb2.GetRunRequest(run_id=run.run_id), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "bob-agent has 3 calls open, the most one identity may (limits.calls_per_identity)" in info.value.details()
    assert machine.client(server, "owner").get_run(run.run_id).run_id == run.run_id
    assert machine.client(server, "person").get_run(run.run_id).run_id == run.run_id
    watches[0].cancel()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert agent.get_run(run.run_id).run_id == run.run_id
            break
        except ResourceExhausted:
            assert time.monotonic() < deadline, "a cancelled watch still counts"
            time.sleep(0.05)
    for watch in watches[1:]:
        watch.cancel()


def test_a_share_group_reads_the_store_but_never_the_tokens(machine: Machine) -> None:
    """`share_group:` opens the home and the store to one group (0750); the tokens and the owner's token stay 0600."""
    import grp

    group = grp.getgrgid(os.getgroups()[-1] if os.geteuid() else 65534).gr_name
    machine.start(share_group=group)
    home, store = machine.home, machine.home / "store"
    for folder in (home, store):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750 and grp.getgrgid(folder.stat().st_gid).gr_name == group
    for name in ("tokens.yaml", "token"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
