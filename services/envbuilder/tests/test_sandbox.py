"""The sandbox of build steps: the allow-list of variables, a private HOME, and Landlock's reads and writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from simrun_envbuilder.sandbox import build_variables, confined, interpreter_prefixes
from simrun_runtime.confine import landlock_abi

PROBE = """
import json, os, pathlib, sys
secret, mine, theirs = map(pathlib.Path, sys.argv[1:4])
found = {"env": sorted(os.environ), "home": os.environ.get("HOME")}
for name, action in (("read", lambda: secret.read_text()), ("write_theirs", lambda: theirs.write_text("x")),
                     ("write_mine", lambda: mine.write_text("built"))):
    try:
        action()
        found[name] = "done"
    except OSError as exc:
        found[name] = type(exc).__name__
print(json.dumps(found))
"""


def test_the_allow_list_keeps_no_secret_and_passes_proxies() -> None:
    server = {"PATH": "/usr/bin", "SIMRUN_TOKEN": "t", "HOME": "/root", "HTTPS_PROXY": "http://proxy:3128"}
    assert build_variables({"UV_NO_CONFIG": "1"}, server) == {
        "PATH": "/usr/bin",
        "HTTPS_PROXY": "http://proxy:3128",
        "UV_NO_CONFIG": "1",
    }


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_confined_step_reads_and_writes_only_what_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMRUN_TOKEN", "the-servers-own-token")
    secret, out, other = tmp_path / "token", tmp_path / "out", tmp_path / "other"
    secret.write_text("the-owners-token")
    out.mkdir()
    other.mkdir()
    command = [sys.executable, "-c", PROBE, str(secret), str(out / "wheel"), str(other / "forged")]
    reads = interpreter_prefixes(sys.executable)
    with confined(command, {}, read=reads, write=[out]) as (argv, env):
        scratch = Path(env["HOME"])
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    # Refused by Landlock (EACCES), or by the read-only view a root server adds (EROFS).
    assert found["read"] == "PermissionError" and found["write_theirs"] in ("PermissionError", "OSError")
    assert found["write_mine"] == "done" and (out / "wheel").read_text() == "built"
    assert "SIMRUN_TOKEN" not in found["env"] and found["home"] == str(scratch)
    assert not scratch.exists() and not (other / "forged").exists()


def test_off_runs_unconfined_but_still_without_the_servers_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMRUN_TOKEN", "the-servers-own-token")
    command = [sys.executable, "-c", "import os; print(os.environ.get('SIMRUN_TOKEN', 'none'))"]
    with confined(command, {}, enabled=False) as (argv, env):
        assert argv == command
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert result.stdout.strip() == "none"
