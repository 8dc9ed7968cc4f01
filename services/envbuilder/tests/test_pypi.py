"""One environment through PyPI: a real hatchling model, whose editable install needs `editables` in the venv."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
from simrun_envbuilder.builder import BuilderSettings, EnvironmentBuilder, EnvironmentState
from simrun_runtime.layout import StoreLayout


@pytest.mark.network
def test_a_hatchling_model_from_pypi_builds_and_runs_editable(settings: BuilderSettings, kit) -> None:
    builder = EnvironmentBuilder(replace(settings, uv=replace(settings.uv, find_links=(), no_index=False)))
    try:
        files = {
            "pyproject.toml": '[project]\nname = "hatchmodel"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
            'dependencies = ["attrs"]\n[build-system]\nrequires = ["hatchling>=1.27"]\n'
            'build-backend = "hatchling.build"\n',
            "hatchmodel/__init__.py": "import attrs\nCODE = 'from pypi'\n",
        }
        ref = kit.snapshot("hatchmodel", files)
        environment = kit.wait_ready(builder, builder.resolve([ref]).environment_id, timeout_s=110)
        assert environment.state is EnvironmentState.READY, environment.message
        assert any(p.startswith("hatchling==1.27.0") for p in environment.packages), "the constraints file pins it"
        assert any(p.startswith("editables==") for p in environment.packages)
        python = builder.interpreter(environment.environment_id, snapshots=[ref])
        out = subprocess.run(
            [python, "-c", "import hatchmodel; print(hatchmodel.CODE)"], capture_output=True, text=True
        )
        assert out.stdout.strip() == "from pypi", out.stderr
    finally:
        builder.close()


@pytest.mark.network
def test_a_model_without_a_build_system_is_not_built(settings: BuilderSettings, kit) -> None:
    """uv's rule: no `[build-system]`, no package. Its dependencies are installed, no backend is, and the overlay
    holds no install of it: a task finds it from the model's root, first on `sys.path`."""
    builder = EnvironmentBuilder(replace(settings, uv=replace(settings.uv, find_links=(), no_index=False)))
    try:
        files = {
            "pyproject.toml": '[project]\nname = "squares"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
            'dependencies = ["attrs"]\n',
            "squares/__init__.py": "CODE = 'squares'\n",
            "models/a.xml": "<sbml/>",
        }
        ref = kit.snapshot("squares", files)
        environment = kit.wait_ready(builder, builder.resolve([ref]).environment_id, timeout_s=110)
        assert environment.state is EnvironmentState.READY, environment.message
        assert any(p.startswith("attrs==") for p in environment.packages)
        assert not any(p.startswith("setuptools==") for p in environment.packages), environment.packages
        python = builder.interpreter(environment.environment_id, snapshots=[ref])
        probe = [python, "-c", "import attrs, squares; print(squares.CODE)"]
        elsewhere = subprocess.run(probe, capture_output=True, text=True, check=False, cwd="/")
        assert "No module named 'squares'" in elsewhere.stderr, "the overlay holds no install of it"
        root = ref.resolve(StoreLayout(kit.store))
        out = subprocess.run(probe, capture_output=True, text=True, check=False, cwd=root)
        assert out.stdout.strip() == "squares", out.stderr
    finally:
        builder.close()
