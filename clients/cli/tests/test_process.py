"""`simrun` as a real process: help, an unreachable server in one line, `simrun server` until SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simrun_cli.server import load_nodes
from simrun_core.errors import InvalidArgument
from simrun_runtime.confine import landlock_abi

SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"


def _free_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    # The web view beside each server on a free port: a server of the machine's own holds the default one.
    return {**env, "SIMRUN_HOME": str(home), "SIMRUN_WEB_ADDRESS": "127.0.0.1:0", **extra}


def test_help_lists_the_commands() -> None:
    done = subprocess.run([SIMRUN, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    for command in ("submit", "status", "list", "compare", "estimate", "cancel", "logs", "snapshot", "server"):
        assert re.search(rf"^\s+{command}\s", done.stdout, re.MULTILINE), command


def test_an_unreachable_server_is_one_line_without_traceback(tmp_path: Path) -> None:
    endpoint = _free_endpoint()
    done = subprocess.run(
        [SIMRUN, "list", "--token", "t"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path, SIMRUN_ENDPOINT=endpoint),
    )
    assert done.returncode == 1
    assert done.stderr == f"Error: cannot reach simrun at {endpoint}: start it with `simrun server`\n"
    assert done.stdout == ""


def test_whoami_wait_gives_up_with_the_reason_after_its_seconds(tmp_path: Path) -> None:
    endpoint = _free_endpoint()
    started = time.monotonic()
    done = subprocess.run(
        [SIMRUN, "whoami", "--wait", "1.5"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path, SIMRUN_ENDPOINT=endpoint),
    )
    waited = time.monotonic() - started
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"Error: cannot reach simrun at {endpoint}: start it with `simrun server`\n"
    assert 1.5 <= waited < 10, waited


def test_whoami_wait_answers_once_a_server_started_later_wrote_its_token(tmp_path: Path) -> None:
    """The README's first start: the home has no token yet when the client starts waiting."""
    endpoint = _free_endpoint()
    env = _env(tmp_path / "home", SIMRUN_ENDPOINT=endpoint)
    waiting = subprocess.Popen(
        [SIMRUN, "whoami", "--wait", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    time.sleep(1.0)
    assert waiting.poll() is None, waiting.communicate()
    server = subprocess.Popen(
        [SIMRUN, "server", "--address", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert out == "owner (owner), priority owner\n"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        waiting.kill()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`simrun server --nodes …` as a process: its endpoint and home; SIGTERM must then end it cleanly."""
    tmp_path = tmp_path_factory.mktemp("served")
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- {name: node-a, cores: 1, memory_gb: 2}\n- {name: node-b, cores: 1, memory_gb: 2}\n")
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [SIMRUN, "server", "--store", str(tmp_path / "store"), "--address", "127.0.0.1:0", "--nodes", str(nodes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(home),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.match(r"simrun serves at (127\.0\.0\.1:\d+), runs in (.+)$", first)
        assert match, first + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        assert Path(match.group(2)) == (tmp_path / "store").resolve()
        assert str(home / "token") in proc.stdout.readline()
        yield match.group(1), home
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "simrun stopped" in out


def _simrun(served: tuple[str, Path], *args: str | Path) -> subprocess.CompletedProcess[str]:
    endpoint, home = served
    command = [SIMRUN, *map(str, args), "--endpoint", endpoint]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=_env(home))


def test_server_serves_its_nodes_to_clients_that_find_the_token_in_its_home(served: tuple[str, Path]) -> None:
    listed = _simrun(served, "nodes", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [node["name"] for node in json.loads(listed.stdout)["nodes"]] == ["node-a", "node-b"]


def test_ctrl_c_stops_following_not_the_run(served: tuple[str, Path], model_repo: Path) -> None:
    endpoint, home = served
    proc = subprocess.Popen(
        [SIMRUN, "submit", str(model_repo / "slow.yaml"), "--watch", "--endpoint", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(home, COLUMNS="120"),
    )
    assert proc.stdout is not None
    match = re.match(r"submitted run (\S+)", proc.stdout.readline())
    assert match
    run_id = match.group(1)
    time.sleep(0.5)  # let it reach the watch, a moment after it says it submitted
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err == f"stopped following run {run_id}; it goes on: `simrun status {run_id} --watch`\n"
    status = json.loads(_simrun(served, "status", run_id, "--json").stdout)
    assert status["state"] in ("RUN_STATE_SUBMITTING", "RUN_STATE_QUEUED", "RUN_STATE_RUNNING")
    assert _simrun(served, "cancel", run_id).returncode == 0


def test_a_bad_nodes_file_says_what_is_wrong(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: a, cores: 0, memory_gb: 2}\n")
    with pytest.raises(InvalidArgument, match="cores"):
        load_nodes(nodes)
    nodes.write_text("nodes:\n  - {name: a, cores: 2, memory_gb: 2}\n")
    assert [n.name for n in load_nodes(nodes)] == ["a"]
    done = subprocess.run(
        [SIMRUN, "server", "--nodes", str(nodes.with_name("missing.yaml"))],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path),
    )
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_tokens_add_prints_a_token_once_that_the_running_server_accepts(served: tuple[str, Path]) -> None:
    endpoint, home = served
    added = subprocess.run(
        [SIMRUN, "tokens", "add", "dora-agent", "--agent-of", "dora"], capture_output=True, text=True, env=_env(home)
    )
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert "shown only now" in added.stderr and token not in (home / "tokens.yaml").read_text()
    whoami = subprocess.run(
        [SIMRUN, "whoami", "--endpoint", endpoint, "--token", token], capture_output=True, text=True, env=_env(home)
    )
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.strip() == "dora-agent (agent, acting for dora), priority agent"
    listed = subprocess.run([SIMRUN, "tokens", "list"], capture_output=True, text=True, env=_env(home))
    assert "dora-agent\tagent for dora\tagent" in listed.stdout and token not in listed.stdout


def test_a_second_server_on_the_same_home_is_one_line_naming_the_first(served: tuple[str, Path]) -> None:
    _, home = served
    done = subprocess.run(
        [SIMRUN, "server", "--address", "127.0.0.1:0"], capture_output=True, text=True, timeout=60, env=_env(home)
    )
    assert done.returncode == 1
    expected = r"Error: another simrun server \(pid \d+\) uses the home .+: stop it, or give this one another home\n"
    assert re.fullmatch(expected, done.stderr), done.stderr
    endpoint, _ = served
    same_address = subprocess.run(
        [SIMRUN, "server", "--address", endpoint], capture_output=True, text=True, timeout=60, env=_env(home)
    )
    assert same_address.returncode == 1 and re.fullmatch(expected, same_address.stderr), same_address.stderr


def test_plaintext_beyond_loopback_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [SIMRUN, "server", "--address", "0.0.0.0:0"], capture_output=True, text=True, timeout=60, env=_env(tmp_path)
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Error: refusing to serve plaintext on 0.0.0.0:0") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--address", "notahost"], "give HOST:PORT"),
        (["--address", "notahost.invalid:5000"], "cannot resolve the host 'notahost.invalid'"),
        (["--address", "127.0.0.1:99999"], "the port must be a number from 0 to 65535"),
        (["--store", "/proc/nope"], "cannot use /proc/nope as the store"),
    ],
)
def test_server_refuses_a_bad_address_or_store_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    from click.testing import CliRunner
    from simrun_cli.main import cli

    result = CliRunner().invoke(cli, ["server", *args], env={"SIMRUN_HOME": str(tmp_path / "home")})
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_second_server_on_the_same_port_or_store_is_refused(served: tuple[str, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner
    from simrun_cli.main import cli

    endpoint, home = served
    taken = CliRunner().invoke(cli, ["server", "--address", endpoint, "--store", str(tmp_path / "store")])
    assert taken.exit_code == 1 and "is another simrun server running?" in taken.stderr, taken.output
    same_store = ["server", "--address", "127.0.0.1:0", "--store", str(home.parent / "store")]
    shared = CliRunner().invoke(cli, same_store, env={"SIMRUN_HOME": str(tmp_path / "home")})
    assert shared.exit_code == 1 and "another simrun server (pid " in shared.stderr, shared.output
    assert "uses the store" in shared.stderr


def test_a_port_whose_closed_connections_wait_out_time_wait_is_free_and_a_listened_one_is_not() -> None:
    """A server killed with connections open (its own web view's to its gateway, a client's) closes them first, so
    they wait in TIME_WAIT on its port for a minute: its restart on that port must not be refused for them."""
    import socket

    from simrun_cli.server import check_port_free
    from simrun_core.errors import FailedPrecondition

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(FailedPrecondition, match="is another simrun server running"):
        check_port_free(address)
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    accepted.close()  # the server's side closes first, and waits in TIME_WAIT
    listener.close()
    try:
        check_port_free(address)
    finally:
        client.close()


def test_a_server_killed_after_its_web_view_was_used_restarts_on_its_ports_at_once(tmp_path: Path) -> None:
    import requests

    endpoint, web = _free_endpoint(), _free_endpoint()
    env = _env(tmp_path / "home", SIMRUN_ENDPOINT=endpoint, SIMRUN_WEB_ADDRESS=web)

    def serving() -> subprocess.Popen[bytes]:
        server = subprocess.Popen([SIMRUN, "server"], stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        ready = subprocess.run([SIMRUN, "whoami", "--wait", "30"], capture_output=True, text=True, env=env, timeout=60)
        assert ready.returncode == 0 and server.poll() is None, (ready.stderr, server.poll())
        return server

    first = serving()
    link = subprocess.run([SIMRUN, "ui", "--no-browser"], capture_output=True, text=True, env=env, timeout=30)
    with requests.Session() as browser:  # the web view calls its gateway: a connection the kill closes first
        assert browser.get(link.stdout.split()[-1], timeout=10).ok and browser.get(f"http://{web}/runs").ok
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    second = serving()  # at once: not refused while the closed connections wait out TIME_WAIT
    os.killpg(second.pid, signal.SIGTERM)
    second.wait(30)


def test_the_constants_written_out_for_a_quick_start_match_their_sources() -> None:
    from simrun.v1 import common_pb2
    from simrun_cli.main import RUN_STATES
    from simrun_cli.options import DEFAULT_ENDPOINT
    from simrun_core import config

    assert [name.removeprefix("RUN_STATE_").lower() for name in common_pb2.RunState.keys()[1:]] == RUN_STATES
    assert DEFAULT_ENDPOINT == config.DEFAULT_ENDPOINT
    from importlib.metadata import version

    from simrun_cli import __version__

    assert version("simrun-cli") == __version__


@pytest.mark.skipif(landlock_abi() < 1, reason="pods are confined only where the kernel has Landlock")
def test_a_store_under_dev_shm_is_refused_in_one_line_while_pods_are_confined(tmp_path: Path) -> None:
    """Every confined pod (and the describer) gets a /dev/shm of its own, so a store there would look empty to
    them: the server says so at its start, not as a model that cannot be imported at the first submission."""
    store = Path("/dev/shm") / f"simrun-test-{os.getpid()}-{tmp_path.name}"
    try:
        done = subprocess.run(
            [SIMRUN, "server", "--address", "127.0.0.1:0", "--store", str(store)],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(tmp_path / "home"),
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            f"Error: the store {store} is under /dev/shm, which every confined pod has a private one of, so pods "
            "would not see it: put it elsewhere, or set executor.local.confinement: off\n"
        )
        assert not store.exists() or not any(store.iterdir())  # nothing recorded there
    finally:
        shutil.rmtree(store, ignore_errors=True)
