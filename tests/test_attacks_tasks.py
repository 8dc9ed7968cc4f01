"""Attacks by tasks (user code in pods) and through the tracker's read side, on a real server with real pods.

An agent (bob-agent) attacks the owner's finished run, the tokens, the owner's snapshot and the index from its own
tasks: an unsplit task's command, a split task's units and merge. Each attempt is refused and every victim file is
byte-identical (and keeps its mode) afterwards.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack_model import ATTACKS, FORGED_REPORTS
from e2e_support import E2E_MODEL, git_repo, wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_core.config import DriverConfig, ExecutorConfig, Limits, LocalExecutorConfig, ReadPolicy
from simrun_core.errors import InvalidArgument, NotFound, PermissionDenied
from simrun_runtime.confine import landlock_abi
from simrun_runtime.layout import StoreLayout
from test_attacks import SLOW, Machine, fingerprint

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    m = Machine(tmp_path)
    yield m
    m.stop()


@pytest.fixture
def owner_model(tmp_path: Path) -> Path:
    return git_repo(E2E_MODEL, tmp_path / "owner-model")


@pytest.fixture
def attacker_model(tmp_path: Path) -> Path:
    return git_repo(E2E_MODEL, tmp_path / "attacker-model", files={"e2etasks/attacks.py": ATTACKS})


def victim_run(machine: Machine, server, model: Path) -> common_pb2.Run:  # type: ignore[no-untyped-def]
    owner = machine.client(server, "owner")
    run = wait_final(owner, owner.submit(write_workflow(model, SLOW)).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED
    return run


def probe_workflow(model: Path, attacks: list[list[str]], split: bool) -> Path:
    kind = "SplitProbe" if split else "Probe"
    settings = json.dumps({"attacks": attacks, "units": 2})
    text = f"name: probe\ntasks:\n  probe:\n    type: e2etasks.attacks:{kind}\n    settings: {settings}\n"
    return write_workflow(model, text)


def results_of(store: StoreLayout, run_id: str) -> list[str]:
    summary = json.loads(store.run(run_id).task("probe").summary.read_text())
    if "results" in summary:
        return summary["results"]
    return [r for unit in summary["units"] for r in unit] + summary["merge"]


def test_pods_compute_at_a_niceness_below_the_server_s(machine: Machine, attacker_model: Path) -> None:
    """Units, merge and command alike run niced (`executor.local.pod_nice`, 10 by default): a task that takes
    every core leaves the server, its clients and the machine's other programs the CPU they ask for."""
    server = machine.start()
    agent = machine.client(server, "agent")
    run = wait_final(agent, agent.submit(probe_workflow(attacker_model, [["nice", ""]], split=True)).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
    expected = f"nice:{min(19, os.nice(0) + 10)}"  # niceness adds to the server's own (this test's)
    assert results_of(StoreLayout(machine.home / "store"), run.run_id) == [expected] * 3
    log = machine.home / "store" / "runs" / run.run_id / "tasks" / "probe" / "logs" / "w0.log"
    assert ", nice +10, " in log.read_text().splitlines()[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="a private /proc needs root: a user namespace does not own the PIDs")
def test_a_task_sees_no_process_but_its_own(machine: Machine, attacker_model: Path) -> None:
    """A pod's /proc lists only its own processes: not the server (this process), not another account's or run's
    process, whose command lines (a token, a path, a run's settings) were readable by every pod before."""
    marker = f"victim-{uuid.uuid4().hex}"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    try:
        server = machine.start()
        agent = machine.client(server, "agent")
        run = wait_final(agent, agent.submit(probe_workflow(attacker_model, [["processes", ""]], split=True)).run_id)
        assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
        results = results_of(StoreLayout(machine.home / "store"), run.run_id)
    finally:
        victim.kill()
        victim.wait()
    assert len(results) == 3  # two units and the merge
    for result in results:
        assert result.startswith("processes:"), result
        probe = json.loads(result.removeprefix("processes:"))
        seen = probe["seen"]
        assert str(probe["own"]) in seen  # its own processes stay visible (the runtime measures its pool so)
        assert str(os.getpid()) not in seen and str(victim.pid) not in seen and "1" not in seen, seen
        assert not any(marker in (line or "") for line in seen.values()), seen
        assert all("simrun_runtime" in (line or "") for line in seen.values()), seen  # the pod's, nothing else


@pytest.mark.skipif(landlock_abi() < 1, reason="an isolated network needs confined pods")
def test_pods_without_network_reach_no_address_but_their_own(machine: Machine, attacker_model: Path) -> None:
    """`executor.local.pod_network: false`: a task cannot reach this machine's services (the server's own API
    here) nor another machine; with the default it can, which is what the setting is for."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    local_service = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        for network in (True, False):
            home = machine.tmp_path / f"network-{network}"
            machine.tokens.clear()  # the owner's token of this server
            server = machine.start(
                executor=ExecutorConfig(local=LocalExecutorConfig(pod_network=network)), home=home, store=home / "store"
            )
            owner = machine.client(server, "owner")
            attacks = [["connect", server.address], ["connect", local_service]]
            run = wait_final(owner, owner.submit(probe_workflow(attacker_model, attacks, split=True)).run_id)
            assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
            results = results_of(StoreLayout(home / "store"), run.run_id)
            if network:
                assert set(results) == {"connected"}, results
            else:
                assert set(results) == {"refused:ConnectionRefusedError"}, results
                log = home / "store" / "runs" / run.run_id / "tasks" / "probe" / "logs" / "w0.log"
                assert ", no network" in log.read_text().splitlines()[0]
    finally:
        listener.close()


@pytest.mark.parametrize("split", [False, True], ids=["command", "units-and-merge"])
def test_a_task_cannot_read_or_write_what_is_not_its_own(
    machine: Machine, owner_model: Path, attacker_model: Path, split: bool
) -> None:
    server = machine.start()
    victim = victim_run(machine, server, owner_model)
    home = machine.home
    store = StoreLayout(home / "store")
    run = store.run(victim.run_id)
    summary = run.task("values").summary
    snapshot_root = store.snapshots / victim.snapshots[0].name / victim.snapshots[0].snapshot_id
    snapshot_file = next(p for p in snapshot_root.rglob("tasks.py"))
    # The index changes as the attacker's own run is recorded; that the task's writes to it were refused is in the
    # results, and the owner's row is checked through the API below.
    before = fingerprint(home / "tokens.yaml", home / "token", run.root, snapshot_root)
    total = json.loads(summary.read_text())["total"]
    attacks = [
        ["read", str(home / "tokens.yaml")],
        ["read", str(home / "token")],
        ["read", str(summary)],
        ["read", str(snapshot_file)],
        ["list", str(home)],
        ["list", str(store.runs)],
        ["write", str(summary)],
        ["replace", str(run.record)],
        ["write", str(snapshot_file)],
        ["chmod", str(snapshot_file)],
        ["link", str(snapshot_file)],
        ["rename", str(run.root)],
        ["write", str(store.index)],
        ["unlink", str(home / "tokens.yaml")],
    ]
    agent = machine.client(server, "agent")
    attack = wait_final(agent, agent.submit(probe_workflow(attacker_model, attacks, split)).run_id)
    assert attack.state == common_pb2.RUN_STATE_SUCCEEDED, attack.message
    results = results_of(store, attack.run_id)
    assert results and all(r.startswith("refused:") for r in results), results
    assert fingerprint(home / "tokens.yaml", home / "token", run.root, snapshot_root) == before
    owner = machine.client(server, "owner")
    rows = {(row.task_id, row.key): list(row.values) for row in owner.compare(run_ids=[victim.run_id]).rows}
    assert rows[("values", "total")] == [json.dumps(total)]
    assert owner.get_run(victim.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    listed = {r.run_id: r for r in owner.list_runs()}
    assert listed[victim.run_id].state == common_pb2.RUN_STATE_SUCCEEDED and len(listed) == 2


def test_a_pod_sees_the_contract_not_the_servers_secrets(
    machine: Machine, attacker_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMRUN_TOKEN", "the-servers-own-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-cloud-secret")
    server = machine.start()
    agent = machine.client(server, "agent")
    run = wait_final(agent, agent.submit(probe_workflow(attacker_model, [["env", ""]], split=False)).run_id)
    (result,) = results_of(StoreLayout(machine.home / "store"), run.run_id)
    names = json.loads(result.removeprefix("env:"))
    assert "SIMRUN_TASK" in names and "SIMRUN_RUN_DIR" in names
    for secret in ("SIMRUN_TOKEN", "SIMRUN_HOME", "AWS_SECRET_ACCESS_KEY"):
        assert secret not in names
    log = "".join(chunk.lines for chunk in agent.logs(run.run_id, "probe"))
    assert "the-servers-own-token" not in log and "a-cloud-secret" not in log


def test_links_a_task_leaves_in_its_folder_are_not_followed(
    machine: Machine, attacker_model: Path, tmp_path: Path
) -> None:
    """A task replaces its log with a link to the owner's token: the server neither reads nor appends through it."""
    server = machine.start()
    home = machine.home
    secret = tmp_path / "cloud.json"  # a JSON file the server's user can read, e.g. cloud credentials
    secret.write_text(json.dumps({"total": "the-secret", "message": "the-secret"}))
    before = fingerprint(home / "tokens.yaml", home / "token", secret)
    agent = machine.client(server, "agent")
    store = StoreLayout(home / "store")
    attacks = [["symlink", f"TASK_DIR/logs/w0.log|{home / 'token'}"]]
    run = wait_final(agent, agent.submit(probe_workflow(attacker_model, attacks, split=False)).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
    assert results_of(store, run.run_id) == ["planted"]
    log = "".join(chunk.lines for chunk in agent.logs(run.run_id, "probe"))
    assert machine.tokens["owner"] not in log and "exited with exit code 0" in log
    # A summary or failure made a link after the fact (as a task's left-over process could) is not read either.
    task = store.run(run.run_id).task("probe")
    os.replace(task.summary, task.out / "real.json")
    task.summary.symlink_to(secret)
    task.failure.symlink_to(secret)
    comparison = machine.client(server, "owner").compare(run_ids=[run.run_id])
    assert all("the-secret" not in value for row in comparison.rows for value in row.values)
    assert fingerprint(home / "tokens.yaml", home / "token", secret) == before


def test_log_paths_from_a_request_are_invalid_argument(machine: Machine, owner_model: Path) -> None:
    server = machine.start()
    run = victim_run(machine, server, owner_model)
    owner = machine.client(server, "owner")
    for worker in ("../../../../../var/log/*", "*", "**", "/etc/passwd", "w0/../../..", "w0.log", "../logs/w0"):
        with pytest.raises(InvalidArgument, match="a worker is w0, w1, …, exec or merge"):
            list(owner.logs(run.run_id, "values", worker=worker))
    assert "".join(c.lines for c in owner.logs(run.run_id, "values", worker="w0"))


def test_too_many_units_are_refused_before_anything_is_written(machine: Machine, attacker_model: Path) -> None:
    server = machine.start()
    agent = machine.client(server, "agent")
    for units in (10**16, 2**31, 10_000_001):
        text = f"name: huge\ntasks:\n  huge:\n    type: e2etasks.attacks:Huge\n    settings: {{units: {units}}}\n"
        with pytest.raises(InvalidArgument, match=f"count_units returned {units} units, more than the 10000000"):
            agent.submit(write_workflow(attacker_model, text))
    assert not any((machine.home / "store" / "runs").iterdir())
    for who in ("owner", "person", "agent"):
        assert machine.client(server, who).list_runs() == []


def test_active_runs_per_identity_are_bounded(machine: Machine, owner_model: Path) -> None:
    server = machine.start(limits=Limits(active_runs_per_identity=1))
    agent = machine.client(server, "agent")
    slow = write_workflow(owner_model, SLOW.replace("seconds: 0.05", "seconds: 0.5"))
    first = agent.submit(slow)
    with pytest.raises(InvalidArgument, match="bob-agent has 1 runs not yet ended"):
        agent.submit(slow)
    assert wait_final(agent, first.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    assert wait_final(agent, agent.submit(slow).run_id).state == common_pb2.RUN_STATE_SUCCEEDED


def test_a_task_past_its_output_bound_fails_with_a_message(machine: Machine, attacker_model: Path) -> None:
    server = machine.start(limits=Limits(output_bytes_per_task=1 << 20))
    agent = machine.client(server, "agent")
    text = "name: w\ntasks:\n  w:\n    type: e2etasks.attacks:Writer\n    settings: {mib: 3}\n"
    workflow = write_workflow(attacker_model, text)
    run = wait_final(agent, agent.submit(workflow).run_id)
    assert run.state == common_pb2.RUN_STATE_FAILED
    assert "more than the 1048576 it may (limits.output_bytes_per_task)" in run.message


def test_a_task_that_fills_the_disk_is_stopped_while_it_runs(machine: Machine, attacker_model: Path) -> None:
    """It would write 400 MiB over more than 20 s, then end: measured while it runs, it is stopped soon after it
    passes its 4 MiB bound, and what it wrote is gone with its attempt."""
    server = machine.start(limits=Limits(output_bytes_per_task=4 << 20), driver=DriverConfig(output_check_s=0.5))
    agent = machine.client(server, "agent")
    text = "name: w\ntasks:\n  w:\n    type: e2etasks.attacks:Writer\n    settings: {mib: 400, pause_s: 0.05}\n"
    begun = time.monotonic()
    run = wait_final(agent, agent.submit(write_workflow(attacker_model, text)).run_id)
    assert time.monotonic() - begun < 15
    assert run.state == common_pb2.RUN_STATE_FAILED
    assert re.fullmatch(
        r"task w failed: the task wrote \d+ bytes of output, more than the 4194304 it may "
        r"\(limits.output_bytes_per_task\)",
        run.message,
    ), run.message
    task = machine.home / "store" / "runs" / run.run_id / "tasks" / "w"
    deadline = time.monotonic() + 15
    while "exited with exit code 143: failed; stopped" not in (task / "logs" / "w0.log").read_text():
        assert time.monotonic() < deadline, (task / "logs" / "w0.log").read_text()
        time.sleep(0.1)
    assert sum(p.stat().st_size for p in task.rglob("*") if p.is_file()) < 1 << 20


@pytest.mark.parametrize("evade", [False, True])
def test_a_pod_printing_without_end_is_killed_and_its_log_cut_back(
    machine: Machine, attacker_model: Path, evade: bool
) -> None:
    """A pod's log is bounded: past `log_bytes_per_pod` the pod dies, its task fails saying why (not retried), and
    the log holds the bound and simrun's own lines; moving the log aside does not hide what the pod prints."""
    server = machine.start(executor={"local": {"log_bytes_per_pod": 1 << 20}})
    agent = machine.client(server, "agent")
    text = f"name: s\ntasks:\n  s:\n    type: e2etasks.attacks:Shouter\n    settings: {{evade: {str(evade).lower()}}}\n"
    submitted = agent.submit(write_workflow(attacker_model, text))
    followed = "".join(chunk.lines for chunk in agent.logs(submitted.run_id, "s", follow=True, timeout_s=120))
    run = wait_final(agent, submitted.run_id)
    assert run.state == common_pb2.RUN_STATE_FAILED
    assert "printed more than the 1048576 bytes a pod may (executor.local.log_bytes_per_pod)" in run.message
    logs = machine.home / "store" / "runs" / run.run_id / "tasks" / "s" / "logs"
    sizes = {p.name: p.stat().st_size for p in logs.iterdir()}
    assert len(sizes) == 1 + evade, sizes  # one attempt only: not retried
    assert all(size < (1 << 20) + 4096 for size in sizes.values()), sizes
    # Followed while it grew, the log ends with simrun's word on it, on a line of its own.
    if not evade:
        assert re.search(r"\n=== simrun: attempt 1 exited with [^\n]*printed more than [^\n]* ===\n$", followed)


def test_an_agent_cannot_reserve_the_only_node(machine: Machine, owner_model: Path) -> None:
    server = machine.start()
    agent, owner = machine.client(server, "agent"), machine.client(server, "owner")
    with pytest.raises(PermissionDenied, match="bob-agent may not reserve node node-a"):
        agent.submit(write_workflow(owner_model, SLOW + "reserve: node-a\n"))
    assert {n.name: n.reserved_by for n in owner.nodes()} == {"node-a": ""}
    assert not any((machine.home / "store" / "runs").iterdir())
    run = owner.submit(write_workflow(owner_model, SLOW + "reserve: node-a\n"))
    assert wait_final(owner, run.run_id).state == common_pb2.RUN_STATE_SUCCEEDED


def test_the_read_policy_hides_others_runs(machine: Machine, owner_model: Path) -> None:
    server = machine.start()
    owner_run = victim_run(machine, server, owner_model)
    agent, person = machine.client(server, "agent"), machine.client(server, "person")
    agent_run = wait_final(agent, agent.submit(write_workflow(owner_model, SLOW, "agent.yaml")).run_id)
    assert [r.run_id for r in agent.list_runs()] == [agent_run.run_id]
    assert [r.run_id for r in person.list_runs()] == [agent_run.run_id]  # bob sees his agent's
    assert {r.run_id for r in machine.client(server, "owner").list_runs()} == {owner_run.run_id, agent_run.run_id}
    for client in (agent, person):
        with pytest.raises(NotFound, match=f"no run '{owner_run.run_id}'"):
            client.get_run(owner_run.run_id)
        with pytest.raises(NotFound):
            list(client.logs(owner_run.run_id, "values"))
        with pytest.raises(NotFound):
            client.compare(run_ids=[owner_run.run_id])
        with pytest.raises(NotFound):
            client.wait(owner_run.run_id)
        with pytest.raises(NotFound):
            client.cancel(owner_run.run_id)
        assert [r for r in client.compare(group="default").run_ids] == [agent_run.run_id]


def test_agents_see_their_person_when_the_config_says_so(machine: Machine, owner_model: Path) -> None:
    server = machine.start(read_policy=ReadPolicy(agents_see_their_person=True))
    person, agent = machine.client(server, "person"), machine.client(server, "agent")
    run = wait_final(person, person.submit(write_workflow(owner_model, SLOW)).run_id)
    assert agent.get_run(run.run_id).run_id == run.run_id
    with pytest.raises(PermissionDenied, match="only they or the owner may cancel"):
        agent.cancel(run.run_id)


def test_outputs_follow_the_read_policy_and_no_link_leads_out(
    machine: Machine, owner_model: Path, attacker_model: Path, tmp_path: Path
) -> None:
    server = machine.start()
    victim = victim_run(machine, server, owner_model)
    agent = machine.client(server, "agent")
    with pytest.raises(NotFound):
        agent.outputs(victim.run_id)
    with pytest.raises(NotFound):
        agent.fetch_output(victim.run_id, "values", "values", tmp_path / "loot")
    # The agent's own output holds a link to the owner's token (left by a process of its task, say): it is
    # neither listed nor fetched.
    run = wait_final(agent, agent.submit(probe_workflow(attacker_model, [], split=False)).run_id)
    report = StoreLayout(machine.home / "store").run(run.run_id).task("probe").out_port("report")
    (report / "token").symlink_to(machine.home / "token")
    assert [f.path for f in agent.outputs(run.run_id, "probe", "report")] == ["report.json"]
    fetched = agent.fetch_output(run.run_id, "probe", "report", tmp_path / "mine")
    assert [p.name for p in fetched] == ["report.json"]
    assert machine.tokens["owner"] not in "".join(p.read_text() for p in fetched)


def test_oversized_names_in_requests_are_refused_not_internal(machine: Machine, owner_model: Path) -> None:
    """Every name a request carries is bounded before it reaches the file system or the index (a name longer
    than a path component was an OSError, INTERNAL; a group or request id of megabytes was kept in every row)."""
    server = machine.start()
    agent = machine.client(server, "agent")
    mine = wait_final(agent, agent.submit(write_workflow(owner_model, SLOW)).run_id)
    long = "a" * 300
    for run_id in (long, "." + long, "x" * 129):
        with pytest.raises(NotFound, match="no run"):
            agent.get_run(run_id)
        with pytest.raises(NotFound, match="no run"):
            list(agent.logs(run_id, "values"))
    with pytest.raises(InvalidArgument, match="is not an output port name: 1-128 letters"):
        agent.outputs(mine.run_id, "values", long)
    with pytest.raises(InvalidArgument, match="is not an output port name"):
        agent.fetch_output(mine.run_id, "values", long, owner_model / "loot")
    with pytest.raises(NotFound, match="no run"):
        agent.submit(write_workflow(owner_model, SLOW, "resume.yaml"), resume_from=long)
    runs = sorted(p.name for p in (machine.home / "store" / "runs").iterdir())
    for options, words in (
        ({"group": "g" * 100_000}, "the group is 100000 characters, more than the 128"),
        ({"group": "two\nlines"}, "the group 'two\\\\nlines' holds a control character"),
        ({"request_id": "r" * 10_000}, "the request id is 10000 characters, more than the 128"),
    ):
        with pytest.raises(InvalidArgument, match=words):
            agent.submit(write_workflow(owner_model, SLOW, "bad.yaml"), **options)
    named = SLOW.replace("name: slow", "name: " + "n" * 200)
    with pytest.raises(InvalidArgument, match="the workflow name is 200 characters"):
        agent.submit(write_workflow(owner_model, named, "named.yaml"))
    assert sorted(p.name for p in (machine.home / "store" / "runs").iterdir()) == runs
    assert [r.run_id for r in agent.list_runs()] == [mine.run_id]


@pytest.mark.parametrize("attack", ["fifo", "junk"])
def test_a_tasks_progress_file_cannot_stall_or_break_the_servers_reads(
    machine: Machine, owner_model: Path, attacker_model: Path, attack: str
) -> None:
    """The server reads a task's `progress.jsonl` for every GetRun and watch: a FIFO held open in its place (the
    read waited under the lock every read shares, so no identity could get any run) or lines that are not JSON
    leave every read answering."""
    server = machine.start()
    victim = victim_run(machine, server, owner_model)
    # The attack holds for 5 s, past the 3 s a read may take: a read that waits on it fails.
    agent, owner = machine.client(server, "agent", timeout_s=3), machine.client(server, "owner", timeout_s=3)
    attacks = [[attack, "TASK_DIR/progress.jsonl"], ["sleep", "5"]]
    settings = json.dumps({"attacks": attacks, "units": 1})
    text = f"name: p\ntasks:\n  probe:\n    type: e2etasks.attacks:SplitProbe\n    settings: {settings}\n"
    run = agent.submit(write_workflow(attacker_model, text))
    planted = StoreLayout(machine.home / "store").run(run.run_id).task("probe").progress
    deadline = time.monotonic() + 60
    while not (planted.exists() and (attack != "junk" or planted.stat().st_size > 8 << 20)):
        assert time.monotonic() < deadline, "the task never planted its progress file"
        time.sleep(0.05)
    for _ in range(3):
        assert agent.get_run(run.run_id).run_id == run.run_id
        assert owner.get_run(victim.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    final = wait_final(agent, run.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message


def test_a_task_cannot_poison_the_learner_with_forged_worker_reports(
    machine: Machine, owner_model: Path, tmp_path: Path
) -> None:
    """Observations come from the worker reports a task's pods write: an agent's `Slow` in a snapshot named as the
    owner's model forges reports of 56 GiB per process and kills for memory. Only the server's own facts count (the
    pods it started, the kills it saw, the memory it gave and its executor measured), so the owner's next run of
    `Slow` still fits and the key's memory does not grow from run to run."""
    server = machine.start()
    tasks = (owner_model / "e2etasks" / "tasks.py").read_text()
    forger = git_repo(
        E2E_MODEL, tmp_path / "agent" / owner_model.name, files={"e2etasks/tasks.py": tasks + FORGED_REPORTS}
    )
    agent, owner = machine.client(server, "agent"), machine.client(server, "owner")

    def task_of(run_id: str) -> dict:  # type: ignore[type-arg]
        return json.loads((machine.home / "store" / "runs" / run_id / "run.json").read_text())["tasks"]["values"]

    shapes = []
    for n in range(4):
        # Each run is of other settings, so none reuses another's outputs (a reused task runs no pod).
        workflow = write_workflow(forger, SLOW.replace("seed: 3", f"seed: {n}"), f"forge-{n}.yaml")
        run = wait_final(agent, agent.submit(workflow).run_id)
        assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
        assert run.snapshots[0].name == owner_model.name
        task = task_of(run.run_id)
        shapes.append(task["plan"]["shape"])
        # The server measured what each worker's pods really held: the forged 56 GiB is not in it.
        assert task["measured_memory_gb"] and max(task["measured_memory_gb"].values()) < 0.5, task
    run = wait_final(owner, owner.submit(write_workflow(owner_model, SLOW)).run_id)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
    shapes.append(task_of(run.run_id)["plan"]["shape"])
    # Learned from the executor's measurement, a key's memory does not grow run after run (bounded by the pods'
    # limits only, each run's plan was 1.1x the last's).
    assert len({shape["memory_gb"] for shape in shapes[1:]}) == 1, shapes
    assert shapes[-1]["memory_gb"] <= 2, shapes


def test_a_tasks_failure_message_cannot_drive_the_owners_terminal(
    machine: Machine, attacker_model: Path, tmp_path: Path
) -> None:
    """A task's failure message and the names of its output files are shown to whoever reads the run: an escape
    sequence in them (here OSC 52, which writes the reader's clipboard, and a clear screen) is shown, not sent."""
    from click.testing import CliRunner
    from simrun_cli.main import cli

    server = machine.start()
    agent = machine.client(server, "agent")
    attacks = [["raise", "boom ESC]52;c;cm0gLXJmIH4=BEL ESC[2J done"]]
    run = wait_final(agent, agent.submit(probe_workflow(attacker_model, attacks, split=False)).run_id)
    assert run.state == common_pb2.RUN_STATE_FAILED
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": machine.tokens["owner"], "COLUMNS": "300"}
    status = CliRunner().invoke(cli, ["status", run.run_id], env=env, catch_exceptions=False)
    assert "boom \\x1b]52;c;cm0gLXJmIH4=\\x07 \\x1b[2J done" in status.output, status.output
    assert "\x1b" not in status.output and "\x07" not in status.output
