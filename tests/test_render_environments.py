"""`simrun render` describes a model's types in the model's own environment, locked and built as a submission's is,
so a model whose dependencies this Python lacks renders as it would run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from envbuilder_support import build_wheelhouse
from simrun_cli.main import cli
from test_e2e_environments import make_trees

IMAGE = "registry.simrun:5000/simrun/environments@sha256:" + "7e" * 32


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


def test_render_describes_the_types_in_the_model_s_own_environment(tmp_path: Path, wheelhouse: Path) -> None:
    model = make_trees(tmp_path / "trees")  # its tasks import tinydep (not in this Python) and a library beside it
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump([{"name": "node-a", "cores": 4, "memory_gb": 8}]))
    config = tmp_path / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "environments": {
                    "find_links": [str(wheelhouse)],
                    "no_index": True,
                    "uv_cache_dir": str(tmp_path / "uv-cache"),
                    "compile_bytecode": False,
                },
                "executor": {"kind": "kubernetes", "kubernetes": {"namespace": "sims", "default_image": IMAGE}},
            }
        )
    )
    home = tmp_path / "home"
    args = ["render", str(model / "where.yaml"), "--nodes", str(nodes), "--config", str(config)]
    result = CliRunner().invoke(cli, args, env={"SIMRUN_HOME": str(home)})
    assert result.exit_code == 0, result.output
    workflow = yaml.safe_load(result.stdout)
    assert workflow["metadata"]["namespace"] == "sims"
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert templates["where-w0"]["container"]["image"] == IMAGE
    mounts = [m for m in templates["where-w0"]["container"]["volumeMounts"] if m["name"] == "store"]
    snapshots = sorted(m["subPath"].split("/")[1] for m in mounts if m["subPath"].startswith("snapshots/"))
    assert snapshots == ["lib", "model"]  # the model's and its library's snapshots, read-only, and no other
    assert [m["subPath"].split("/", 2)[2] for m in mounts if not m.get("readOnly")] == ["tasks/where"]
    assert "building the model's environment" in result.stderr
    assert list((home / "render" / "environments" / "envs").iterdir())  # built once per lock, kept for the next
    again = CliRunner().invoke(cli, args, env={"SIMRUN_HOME": str(home)})
    assert again.exit_code == 0, again.output
    assert "building" not in again.stderr
    # A model that cannot be locked is refused in one line, as a submission would refuse it.
    pyproject = model / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("tinydep==1.0", "tinydep==9.9"))
    refused = CliRunner().invoke(cli, args, env={"SIMRUN_HOME": str(home)})
    assert refused.exit_code == 1 and "Traceback" not in refused.output and "tinydep" in refused.output
