"""Attacks by a model's own build backend, which the environment builder runs at locking and at installing time.

An agent submits a model whose `pyproject.toml` names an in-tree build backend (`backend-path = ["."]`): uv runs
it to read the model's metadata when it locks, and the overlay runs it again to build the editable wheel. At every
import it tries to read the owner's token and the tokens file, to rewrite the owner's finished run, and to drop what
it found where the agent can read it. Each attempt is refused; the environment still builds and the run succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import E2E_MODEL, git_repo, wait_final, write_workflow
from envbuilder_support import build_wheelhouse
from simrun.v1 import common_pb2
from simrun_core.config import EnvironmentsConfig
from simrun_runtime.confine import landlock_abi
from simrun_runtime.layout import StoreLayout
from test_attacks import SLOW, Machine, fingerprint

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")

BACKEND = '''
"""An in-tree build backend that is tinyback plus an attack at every import."""
import json, os, pathlib

def _attack():
    found = {{}}
    for secret in {secrets!r}:
        try:
            found[secret] = pathlib.Path(secret).read_text()
        except OSError as exc:
            found[secret] = "refused:" + type(exc).__name__
    try:
        with open({victim!r}, "a") as f:
            f.write("forged")
        found["victim"] = "wrote"
    except OSError as exc:
        found["victim"] = "refused:" + type(exc).__name__
    found["env"] = sorted(k for k in os.environ if "TOKEN" in k or k in ("SIMRUN_HOME", "AWS_SECRET_ACCESS_KEY"))
    try:
        (pathlib.Path({loot!r}) / f"{{os.getpid()}}.json").write_text(json.dumps(found))
    except OSError:
        pass

_attack()
from tinyback import *  # noqa: E402,F403
'''

TASKS = """
from simrun_runtime import ExecContext, TaskSettings, UnsplitTaskType


class Nothing(UnsplitTaskType):
    class Settings(TaskSettings):
        pass

    outputs = ("o",)

    def run(self, settings, context: ExecContext):
        return {"ok": 1}
"""


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    m = Machine(tmp_path)
    yield m
    m.stop()


def test_a_models_build_backend_runs_confined(
    machine: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMRUN_TOKEN", "the-servers-own-token")
    wheelhouse = build_wheelhouse(tmp_path / "wheelhouse")
    environments = EnvironmentsConfig(
        find_links=[str(wheelhouse)], no_index=True, uv_cache_dir=tmp_path / "uv-cache", compile_bytecode=False
    )
    server = machine.start(environments=environments)
    owner = machine.client(server, "owner")
    victim = wait_final(owner, owner.submit(write_workflow(git_repo(E2E_MODEL, tmp_path / "owner"), SLOW)).run_id)
    assert victim.state == common_pb2.RUN_STATE_SUCCEEDED
    home, store = machine.home, StoreLayout(machine.home / "store")
    summary = store.run(victim.run_id).task("values").summary
    before = fingerprint(home / "tokens.yaml", home / "token", store.run(victim.run_id).root)
    loot = tmp_path / "loot"  # a folder of the server's user, as /tmp or a shared folder would be
    loot.mkdir()
    source = tmp_path / "src"
    (source / "evilmodel").mkdir(parents=True)
    (source / "pyproject.toml").write_text(
        '[project]\nname = "evilmodel"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        '[build-system]\nrequires = ["tinyback==1.0"]\nbuild-backend = "evil"\nbackend-path = ["."]\n'
    )
    secrets = [str(home / "token"), str(home / "tokens.yaml")]
    (source / "evil.py").write_text(BACKEND.format(secrets=secrets, victim=str(summary), loot=str(loot)))
    (source / "evilmodel" / "__init__.py").write_text("")
    (source / "evilmodel" / "tasks.py").write_text(TASKS)
    (source / "w.yaml").write_text("name: w\ntasks:\n  t:\n    type: evilmodel.tasks:Nothing\n")
    model = git_repo(source, tmp_path / "model")
    agent = machine.client(server, "agent")
    run = wait_final(agent, agent.submit(model / "w.yaml").run_id, timeout_s=120)
    assert run.state == common_pb2.RUN_STATE_SUCCEEDED, run.message
    assert run.environment and run.environment != "default"
    assert list(loot.iterdir()) == [], [json.loads(p.read_text()) for p in loot.iterdir()]
    assert fingerprint(home / "tokens.yaml", home / "token", store.run(victim.run_id).root) == before
    assert owner.get_run(victim.run_id).state == common_pb2.RUN_STATE_SUCCEEDED
    build_logs = "".join(p.read_text() for p in (home / "environments").rglob("*.log"))
    assert "the-servers-own-token" not in build_logs and machine.tokens["owner"] not in build_logs
