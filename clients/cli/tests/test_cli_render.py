"""`simrun render`: the Argo Workflow for a workflow file, planned on a nodes file without a server, validated."""

from __future__ import annotations

from pathlib import Path

import kubernetes_schemas as schemas
import pytest
import yaml
from click.testing import CliRunner
from simrun_cli.main import cli
from simrun_tracker.kubernetes.render import check_workflow

IMAGE = "registry.simrun:5000/simrun/env@sha256:" + "cd" * 32


@pytest.fixture(autouse=True)
def render_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """render snapshots the model under `$SIMRUN_HOME/render`: a home of the test's own, never the reader's."""
    home = tmp_path / "home"
    monkeypatch.setenv("SIMRUN_HOME", str(home))
    return home


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A server config whose runs use the server's Python: the example's numpy is this one's, no PyPI in tests
    (`tests/test_render_environments.py` renders a model in an environment of its own)."""
    path = tmp_path / "server.yaml"
    path.write_text("environments: {kind: server}\n")
    return path


def nodes_file(tmp_path: Path, memory_gb: int = 32) -> Path:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump([{"name": n, "cores": 8, "memory_gb": memory_gb} for n in ("node-a", "node-b")]))
    return path


def test_render_prints_the_workflow_the_executor_would_submit(model_repo: Path, tmp_path: Path, config) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "render",
            str(model_repo / "pi.yaml"),
            "--nodes",
            str(nodes_file(tmp_path)),
            "--image",
            IMAGE,
            "--config",
            str(config),
        ],
    )
    assert result.exit_code == 0, result.output
    workflow = yaml.safe_load(result.stdout)
    assert schemas.errors(workflow) == []
    check_workflow(workflow)
    assert (tmp_path / "home" / "render" / "store" / "snapshots").is_dir()
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert {"run", "estimate-w0", "report-w0"} <= set(templates)
    assert templates["estimate-w0"]["container"]["image"] == IMAGE
    assert templates["estimate-w0"]["priorityClassName"] == "simrun-standard-base"
    depends = {t["name"]: t.get("depends") for t in templates["run"]["dag"]["tasks"]}
    assert depends["report-w0"] == "estimate-w0"


def test_render_refuses_what_a_submission_refuses_in_one_line(model_repo: Path, tmp_path: Path, config) -> None:
    runner = CliRunner()
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump([{"name": "node-a", "cores": 1, "memory_gb": 0.01}]))
    refused = runner.invoke(
        cli, ["render", str(model_repo / "pi.yaml"), "--nodes", str(tiny), "--image", IMAGE, "--config", str(config)]
    )
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "task estimate" in refused.output
    tagged = runner.invoke(
        cli, ["render", str(model_repo / "pi.yaml"), "--nodes", str(nodes_file(tmp_path)), "--image", "env:latest"]
    )
    assert tagged.exit_code == 1 and "by digest" in tagged.output


def test_render_without_nodes_plans_on_the_server_s_nodes_with_the_token_s_priority(
    invoke, model_repo: Path, config
) -> None:
    result = invoke("render", model_repo / "pi.yaml", "--image", IMAGE, "--config", config)
    assert result.exit_code == 0, result.output
    workflow = yaml.safe_load(result.stdout)
    assert schemas.errors(workflow) == []
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert templates["estimate-w0"]["priorityClassName"] == "simrun-owner-base"  # the server's owner token


def test_render_without_an_image_previews_with_a_named_placeholder_and_says_so(
    model_repo: Path, tmp_path: Path, config
) -> None:
    result = CliRunner().invoke(
        cli, ["render", str(model_repo / "pi.yaml"), "--nodes", str(nodes_file(tmp_path)), "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    assert "rendered with the placeholder simrun-render-placeholder.invalid/no-image@sha256:" in result.stderr
    workflow = yaml.safe_load(result.stdout)
    assert schemas.errors(workflow) == []
    images = {t["container"]["image"] for t in workflow["spec"]["templates"] if "container" in t}
    assert images == {"simrun-render-placeholder.invalid/no-image@sha256:" + "0" * 64}
