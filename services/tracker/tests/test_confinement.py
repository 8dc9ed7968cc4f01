"""What a local pod sees: the allow-listed variables and the paths of its own task, confined by Landlock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from simrun_core.config import Limits
from simrun_core.errors import InvalidArgument
from simrun_runtime.confine import landlock_abi
from simrun_runtime.layout import StoreLayout
from simrun_tracker.guard import Guard, checked_worker, output_bytes
from simrun_tracker.local.confinement import PodConfinement, PodPaths, check_visible_to_pods, pod_environment

SERVER_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "SIMRUN_HOME": "/root/.simrun",
    "SIMRUN_TOKEN": "s3cret",
    "AWS_SECRET_ACCESS_KEY": "k",
    "SSH_AUTH_SOCK": "/tmp/agent",
    "PYTHONPATH": "/somewhere",
}


def test_a_pod_gets_the_contract_and_the_allow_list_only(tmp_path: Path) -> None:
    env = pod_environment({"SIMRUN_TASK": "t", "SIMRUN_RUN_DIR": "/s/runs/r"}, tmp_path, SERVER_ENV)
    assert env["SIMRUN_TASK"] == "t" and env["PATH"] == "/usr/bin:/bin" and env["LANG"] == "C.UTF-8"
    assert env["HOME"] == env["TMPDIR"] == env["SIMRUN_SCRATCH"] == str(tmp_path)
    for secret in ("SIMRUN_HOME", "SIMRUN_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK", "PYTHONPATH"):
        assert secret not in env
    assert "s3cret" not in json.dumps(env) and "/root" not in json.dumps(env)


def test_the_config_may_pass_more_variables(tmp_path: Path) -> None:
    env = pod_environment({}, tmp_path, {**SERVER_ENV, "OMP_NUM_THREADS": "1"}, extra=["OMP_NUM_THREADS"])
    assert env["OMP_NUM_THREADS"] == "1" and "SIMRUN_TOKEN" not in env


def test_a_contract_variable_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not runtime contract variables: LD_PRELOAD"):
        pod_environment({"LD_PRELOAD": "/x.so"}, tmp_path, SERVER_ENV)


def test_pod_paths_are_the_run_its_snapshots_and_its_own_task(tmp_path: Path) -> None:
    store = StoreLayout(tmp_path / "store")
    paths = PodPaths.of(store, "r1", "fit", [("model", "abc")], tmp_path / "scratch", Path("/sys/fs/cgroup/x"))
    assert paths.read == (store.run("r1").root, store.snapshot("model", "abc"), Path("/sys/fs/cgroup/x"))
    assert paths.write == (store.run("r1").task("fit").root, tmp_path / "scratch")


def test_off_runs_the_command_as_it_is() -> None:
    assert PodConfinement("off").command(sys.executable, ["x"], PodPaths((), ())) == ["x"]


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_confined_pod_reads_its_run_and_nothing_of_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = StoreLayout(home / "store")
    (home / "tokens.yaml").parent.mkdir(parents=True)
    (home / "tokens.yaml").write_text("secret")
    other = store.run("r2").task("t").out
    other.mkdir(parents=True)
    (other / "summary.json").write_text("{}")
    own = store.run("r1").task("t").root
    own.mkdir(parents=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = (
        "import json, os, pathlib\n"
        "out = {}\n"
        f"for name, path in [('tokens', {str(home / 'tokens.yaml')!r}), ('other', {str(other / 'summary.json')!r})]:\n"
        "    try:\n        out[name] = pathlib.Path(path).read_text()\n"
        "    except OSError as e:\n        out[name] = type(e).__name__\n"
        f"pathlib.Path({str(own / 'ok')!r}).write_text('1')\n"
        "out['env'] = sorted(os.environ)\n"
        "print(json.dumps(out))\n"
    )
    confinement = PodConfinement("landlock")
    paths = PodPaths.of(store, "r1", "t", [], scratch)
    command = confinement.command(sys.executable, [sys.executable, "-c", script], paths)
    env = pod_environment({"SIMRUN_TASK": "t"}, scratch, {**SERVER_ENV, "PATH": "/usr/bin:/bin"})
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=own)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["tokens"] == seen["other"] == "PermissionError"
    assert "SIMRUN_TOKEN" not in seen["env"] and (own / "ok").read_text() == "1"


@pytest.mark.parametrize("worker", ["w0", "w12", "exec", "merge"])
def test_worker_names_of_pods_pass(worker: str) -> None:
    assert checked_worker(worker) == worker


@pytest.mark.parametrize("worker", ["../../../../../var/log/*", "*", "**", "/etc/passwd", "w0/../x", "", "W0", "w"])
def test_any_other_worker_name_is_invalid_argument(worker: str) -> None:
    with pytest.raises(InvalidArgument, match="a pod's name is w0, w1, …, exec or merge"):
        checked_worker(worker)


def test_output_beyond_the_limit_fails_the_task(tmp_path: Path) -> None:
    task = StoreLayout(tmp_path).run("r").task("t")
    task.out.mkdir(parents=True)
    (task.out / "big").write_bytes(b"x" * 200_000)
    (task.out / "link").symlink_to("/usr/bin/env")
    (task.root / "again").hardlink_to(task.out / "big")
    assert 200_000 <= output_bytes(task) < 220_000
    assert Guard(Limits(output_bytes_per_task=1_000_000)).output_failure(task) is None
    message = Guard(Limits(output_bytes_per_task=100_000)).output_failure(task)
    assert message and "more than the 100000 it may (limits.output_bytes_per_task)" in message


@pytest.mark.skipif(landlock_abi() < 1, reason="pods are confined only where the kernel has Landlock")
def test_folders_under_dev_shm_are_refused_while_pods_are_confined_even_through_a_link(tmp_path: Path) -> None:
    link = tmp_path / "store"
    link.symlink_to("/dev/shm")
    for folder in (Path("/dev/shm"), Path("/dev/shm/a/store"), link / "x"):
        with pytest.raises(InvalidArgument, match=r"^the store .* is under /dev/shm.*confinement: off$"):
            check_visible_to_pods("auto", {"the store": folder})
        check_visible_to_pods("off", {"the store": folder})  # unconfined pods share the server's /dev/shm
    check_visible_to_pods("landlock", {"the store": tmp_path / "store-elsewhere", "environments": Path("/dev/shmx")})


def test_pods_without_network_need_confinement() -> None:
    with pytest.raises(RuntimeError, match="pod_network: false needs confined pods"):
        PodConfinement("off", network=False)


@pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
def test_a_pod_without_network_is_launched_so_and_its_log_says_it() -> None:
    confinement = PodConfinement("landlock", network=False)
    command = confinement.command(sys.executable, [sys.executable, "-c", "pass"], PodPaths((), ()))
    assert command[3] == "--no-network" and command[-3:] == [sys.executable, "-c", "pass"]
    assert confinement.describe().endswith(", no network")
    assert "--no-network" not in PodConfinement("landlock").command(sys.executable, ["true"], PodPaths((), ()))
