"""`simrun envs` against a real environment builder server on loopback."""

from __future__ import annotations

import json

from click.testing import CliRunner
from simrun_cli.main import cli
from simrun_envbuilder.builder import EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.server import create_server


def test_simrun_envs_lists_id_python_packages_size_and_last_use(builder: EnvironmentBuilder, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files())
    environment = builder.resolve([ref])
    assert kit.wait_ready(builder, environment.environment_id).state is EnvironmentState.READY
    builder.resolve([ref])  # a use
    server = create_server(builder, "127.0.0.1:0").start()
    try:
        env = {"SIMRUN_ENDPOINT": f"127.0.0.1:{server.port}", "SIMRUN_TOKEN": "t", "COLUMNS": "200"}
        shown = CliRunner().invoke(cli, ["envs"], env=env, catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        header, row = shown.output.splitlines()[:2]
        assert header.split() == ["environment", "state", "python", "packages", "size", "last", "used"]
        assert row.split()[:4] == [environment.environment_id, "ready", environment.python_version, "7"]
        listed = CliRunner().invoke(cli, ["envs", "--json"], env=env, catch_exceptions=False)
        data = json.loads(listed.output)
        assert data["environments"][0]["environment_id"] == environment.environment_id
        assert data["environments"][0]["package_count"] == 7
    finally:
        server.stop(None)
