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
from pathlib import Path

import pytest
from simrun_cli.server import load_nodes
from simrun_core.errors import InvalidArgument

SIMRUN = shutil.which("simrun", path=str(Path(sys.executable).parent)) or "simrun"


def _free_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
    return {**env, "SIMRUN_HOME": str(home), **extra}


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


def test_server_serves_its_nodes_until_sigterm(tmp_path: Path) -> None:
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
        # A client on this machine finds the owner's token in the home the server wrote it to.
        listed = subprocess.run(
            [SIMRUN, "nodes", "--json", "--endpoint", match.group(1)],
            capture_output=True,
            text=True,
            timeout=30,
            env=_env(home),
        )
        assert listed.returncode == 0, listed.stderr
        assert [node["name"] for node in json.loads(listed.stdout)["nodes"]] == ["node-a", "node-b"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "simrun stopped" in out and "Traceback" not in err


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
