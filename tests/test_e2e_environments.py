"""End to end through `simrun server` with the environment builder: runs of models with a pyproject.toml run in a
locked venv of their own (an overlay per run), not in the server's Python."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from e2e_support import EXAMPLE, git_repo, wait_final
from envbuilder_support import build_wheelhouse
from simrun.v1 import common_pb2
from simrun_cli.main import cli
from simrun_core.config import EnvironmentsConfig
from simrun_core.errors import InvalidArgument
from simrun_runtime.layout import StoreLayout

TASKS = """
import sys
import tinydep
import tinylib
from simrun_runtime import MergeContext, ResourceHint, SplitTaskType, TaskSettings, UnitContext

from tinymodel import CODE


class Where(SplitTaskType):
    class Settings(TaskSettings):
        units: int = 2

    outputs = ("out",)
    resources = ResourceHint(base_memory_gb=0.1, per_worker_gb=0.1)

    def count_units(self, settings):
        return settings.units

    def compute_unit(self, settings, index, unit: UnitContext):
        (unit.result_dir / "code").write_text(CODE)

    def merge(self, settings, merge: MergeContext):
        return {"code": CODE, "tinydep": tinydep.VERSION, "lib": tinylib.WHO, "python": sys.prefix}
"""

WORKFLOW = "name: where\ntasks:\n  where:\n    type: tinymodel.tasks:Where\n"


def model_pyproject(dependency: str) -> str:
    return f"""[project]
name = "tinymodel"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["{dependency}", "tinylib"]

[tool.uv.sources]
tinylib = {{ path = "../lib" }}

[build-system]
requires = ["tinyback==1.0"]
build-backend = "tinyback"
"""


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


def make_trees(root: Path) -> Path:
    """A model and a library beside it, each its own git working tree."""
    (root / "src-lib" / "tinylib").mkdir(parents=True)
    (root / "src-lib" / "pyproject.toml").write_text(
        '[project]\nname = "tinylib"\nversion = "0.1.0"\n[build-system]\nrequires = ["tinyback==1.0"]\n'
        'build-backend = "tinyback"\n'
    )
    (root / "src-lib" / "tinylib" / "__init__.py").write_text("WHO = 'the library'\n")
    git_repo(root / "src-lib", root / "lib")
    (root / "src-model" / "tinymodel").mkdir(parents=True)
    (root / "src-model" / "pyproject.toml").write_text(model_pyproject("tinydep==1.0"))
    (root / "src-model" / "tinymodel" / "__init__.py").write_text("CODE = 'first'\n")
    (root / "src-model" / "tinymodel" / "tasks.py").write_text(TASKS)
    (root / "src-model" / "where.yaml").write_text(WORKFLOW)
    return git_repo(root / "src-model", root / "model")


def test_a_model_with_a_library_runs_in_its_environment_and_code_changes_build_nothing(
    start_server, client_for, tmp_path: Path, wheelhouse: Path
) -> None:
    model = make_trees(tmp_path / "trees")
    environments = EnvironmentsConfig(
        find_links=[str(wheelhouse)], no_index=True, uv_cache_dir=tmp_path / "uv-cache", compile_bytecode=False
    )
    server = start_server(environments=environments)
    client = client_for(server)
    run = client.submit(model / "where.yaml")
    assert run.state == common_pb2.RUN_STATE_SUBMITTING
    assert [s.name for s in run.snapshots] == ["model", "lib"]
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while (now := client.get_run(run.run_id)).state == common_pb2.RUN_STATE_SUBMITTING and time.monotonic() < deadline:
        seen.add(now.message)
        time.sleep(0.02)
    assert any(m.startswith("building environment") for m in seen), seen
    final = wait_final(client, run.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    store = StoreLayout(server.config.store)
    summary = json.loads(store.run(run.run_id).task("where").summary.read_text())
    assert summary["code"] == "first" and summary["tinydep"] == "1.0" and summary["lib"] == "the library"
    assert "/overlays/" in summary["python"], "the pod ran the run's overlay, not the server's Python"
    environment_id = final.environment
    assert environment_id and environment_id != "default"
    assert json.loads(store.run(run.run_id).record.read_text())["environment"] == environment_id
    lock = store.run(run.run_id).environment_lock.read_text()
    assert 'name = "tinydep"' in lock and "snapshots/" not in lock
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": "tok-alice", "COLUMNS": "200"}
    status = CliRunner().invoke(cli, ["status", run.run_id], env=env, catch_exceptions=False)
    assert f"environment {environment_id}" in status.output
    envs = CliRunner().invoke(cli, ["envs"], env=env, catch_exceptions=False)
    assert environment_id in envs.output

    # A change of the code only: the same environment, no new lock, and the run sees its own code.
    (model / "tinymodel" / "__init__.py").write_text("CODE = 'second'\n")
    locks = sorted(p.name for p in (server.config.home / "environments" / "locks").iterdir())
    again = client.submit(model / "where.yaml")
    assert again.environment == environment_id
    final = wait_final(client, again.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert final.environment == environment_id
    assert json.loads(store.run(again.run_id).task("where").summary.read_text())["code"] == "second"
    assert sorted(p.name for p in (server.config.home / "environments" / "locks").iterdir()) == locks

    # A dependency change: a new environment, whose build `simrun submit --watch` shows instead of sitting silent.
    (model / "pyproject.toml").write_text(model_pyproject("tinydep==2.0"))
    watched = CliRunner().invoke(cli, ["submit", str(model / "where.yaml"), "--watch"], env=env, catch_exceptions=False)
    assert watched.exit_code == 0, watched.output
    assert "building environment" in watched.output
    third = client.list_runs()[0]
    assert third.state == common_pb2.RUN_STATE_SUCCEEDED, third.message
    assert third.environment != environment_id
    assert json.loads(store.run(third.run_id).task("where").summary.read_text())["tinydep"] == "2.0"


def test_an_unlockable_model_is_refused_at_submission(start_server, client_for, tmp_path: Path, wheelhouse) -> None:
    model = make_trees(tmp_path / "trees")
    (model / "pyproject.toml").write_text(model_pyproject("nosuchpackage"))
    environments = EnvironmentsConfig(find_links=[str(wheelhouse)], no_index=True, uv_cache_dir=tmp_path / "uv")
    client = client_for(start_server(environments=environments))
    with pytest.raises(InvalidArgument, match="nosuchpackage"):
        client.submit(model / "where.yaml")
    assert client.list_runs() == []


@pytest.mark.network
def test_the_montecarlo_example_runs_through_the_builder(start_server, client_for, tmp_path: Path) -> None:
    model = git_repo(EXAMPLE, tmp_path / "montecarlo")
    server = start_server(environments=EnvironmentsConfig(compile_bytecode=False))
    client = client_for(server)
    run = client.submit(model / "pi.yaml")
    final = wait_final(client, run.run_id, timeout_s=110)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert final.environment not in ("", "default")
    lock = StoreLayout(server.config.store).run(run.run_id).environment_lock.read_text()
    assert 'name = "numpy"' in lock and 'name = "hatchling"' in lock
    envs = server.config.home / "environments" / "envs"
    assert list(envs.glob(f"{final.environment}/overlays/*/runs/{run.run_id}")), "the pods ran in the run's overlay"
