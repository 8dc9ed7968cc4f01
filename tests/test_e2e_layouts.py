"""The repositories researchers have, each a real git working tree submitted through `simrun submit --watch` and
run to `succeeded` in a locked environment of its own (real uv, wheels written by the test): uv's rule decides
what is built (`simrun_runtime.sources`), and a source that is not a package is imported from its root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from e2e_support import git_repo
from envbuilder_support import BACKEND, build_wheelhouse
from simrun_cli.main import cli
from simrun_core.config import EnvironmentsConfig
from simrun_envbuilder.lock import default_uv_command
from simrun_envbuilder.wheels import write_wheel
from simrun_runtime.layout import StoreLayout

TASK = '''
from pathlib import Path

import tinydep
from simrun_runtime import MergeContext, ResourceHint, SplitTaskType, TaskSettings, UnitContext
{imports}

class Scan(SplitTaskType):
    """Reads what the repository holds beside its code, one unit per line of a data file."""

    class Settings(TaskSettings):
        units: int = 2

    outputs = ("out",)
    resources = ResourceHint(base_memory_gb=0.1, per_worker_gb=0.1)

    def count_units(self, settings):
        return settings.units

    def compute_unit(self, settings, index, unit: UnitContext):
        (unit.result_dir / "value").write_text(str(index))

    def merge(self, settings, merge: MergeContext):
        return {{"tinydep": tinydep.VERSION, {facts}}}
'''


def pyproject(name: str = "research", extra: str = "", dependencies: tuple[str, ...] = ("tinydep==1.0",)) -> str:
    """A `[project]` with no `[build-system]`, as research code that nobody installs has it."""
    return f'[project]\nname = "{name}"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n' + (
        f"dependencies = {json.dumps(list(dependencies))}\n{extra}"
    )


def write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


def submitter(server) -> Callable[..., tuple[str, dict, StoreLayout]]:
    """Submits a workflow to `server` with `simrun submit --watch`; returns the CLI's output, the newest run as
    `simrun list --json` shows it (empty when nothing was recorded) and the store."""
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": "tok-alice", "COLUMNS": "200"}

    def run(workflow: Path, *args: str) -> tuple[str, dict, StoreLayout]:
        result = CliRunner().invoke(cli, ["submit", str(workflow), "--watch", *args], env=env, catch_exceptions=False)
        listed = CliRunner().invoke(cli, ["list", "--json"], env=env, catch_exceptions=False)
        runs = json.loads(listed.output).get("runs", []) if listed.exit_code == 0 else []
        return result.output, runs[0] if runs else {}, StoreLayout(server.config.store)

    return run


def offline(wheelhouse: Path, uv_cache: Path, **settings: object) -> EnvironmentsConfig:
    """Environments built from the test's wheels only."""
    return EnvironmentsConfig(
        find_links=[str(wheelhouse)], no_index=True, uv_cache_dir=uv_cache, compile_bytecode=False, **settings
    )


@pytest.fixture
def submit(start_server, wheelhouse: Path, uv_cache: Path) -> Callable[..., tuple[str, dict, StoreLayout]]:
    return submitter(start_server(environments=offline(wheelhouse, uv_cache)))


def summary(store: StoreLayout, record: dict, task: str = "scan") -> dict:
    return json.loads(store.run(record["run_id"]).task(task).summary.read_text())


def workflow(type_name: str) -> str:
    return f"name: layout\ntasks:\n  scan:\n    type: {type_name}\n"


def succeeded(output: str, record: dict) -> None:
    assert record.get("state") == "RUN_STATE_SUCCEEDED", output + json.dumps(record)[:2000]


def test_a_flat_repository_with_data_folders_and_no_build_system_runs_from_its_root(submit, tmp_path: Path) -> None:
    """The report's repository: `pkscan/` beside `models/`, `data/`, `notebooks/` and `tests/`, no
    `[build-system]`: setuptools refused it ("Multiple top-level packages discovered in a flat-layout")."""
    src = tmp_path / "src"
    facts = (
        '"model": (ROOT / "models" / "pk.xml").read_text(), '
        '"rows": len((ROOT / "data" / "doses.csv").read_text().split()), '
        # Relative to the working directory, as research code reads its data when run from its checkout.
        '"relative": len(Path("data/doses.csv").read_text().split())'
    )
    write(
        src,
        {
            "pyproject.toml": pyproject(),
            "pkscan/__init__.py": "",
            "pkscan/tasks.py": TASK.format(imports="ROOT = Path(__file__).resolve().parents[1]", facts=facts),
            "models/pk.xml": "<sbml/>",
            "data/doses.csv": "1\n2\n3\n",
            "notebooks/look.ipynb": "{}",
            "tests/test_pk.py": "def test_nothing():\n    pass\n",
            "scan.yaml": workflow("pkscan.tasks:Scan"),
        },
    )
    repo = git_repo(src, tmp_path / "pkscan-repo")
    output, record, store = submit(repo / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record) == {"tinydep": "1.0", "model": "<sbml/>", "rows": 3, "relative": 3}
    lock = store.run(record["run_id"]).environment_lock.read_text()
    assert "source = { virtual = " in lock.split('name = "research"')[1].split("[[package]]")[0], lock


def test_several_top_level_packages_and_a_namespace_package_import_from_the_root(submit, tmp_path: Path) -> None:
    src = tmp_path / "src"
    facts = '"a": alpha.NAME, "b": beta.NAME, "ns": shared.names.NAME'
    imports = "import alpha\nimport beta\nimport shared.names"
    write(
        src,
        {
            "pyproject.toml": pyproject(),
            "alpha/__init__.py": "NAME = 'alpha'\n",
            "beta/__init__.py": "NAME = 'beta'\n",
            "shared/names.py": "NAME = 'namespace'\n",  # no __init__.py: a namespace package
            "runner/tasks.py": TASK.format(imports=imports, facts=facts),  # a namespace package too
            "scan.yaml": workflow("runner.tasks:Scan"),
        },
    )
    repo = git_repo(src, tmp_path / "multi")
    output, record, store = submit(repo / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record) == {"tinydep": "1.0", "a": "alpha", "b": "beta", "ns": "namespace"}


def test_a_model_in_a_subfolder_with_a_library_beside_it_that_is_not_a_package(submit, tmp_path: Path) -> None:
    """`study/model` depends on `study/lib` by path; the library has no `[build-system]`: its dependencies are
    installed and its root follows the model's on `sys.path`."""
    src = tmp_path / "src"
    extra = '\n[tool.uv.sources]\nhelpers = { path = "../lib" }\n'
    write(
        src,
        {
            "README.md": "a larger repository\n",
            "model/pyproject.toml": pyproject("model", extra, ("tinydep==1.0", "helpers")),
            "model/scanmodel/__init__.py": "",
            "model/scanmodel/tasks.py": TASK.format(imports="import helpers", facts='"helper": helpers.WHO'),
            "model/scan.yaml": workflow("scanmodel.tasks:Scan"),
            "lib/pyproject.toml": pyproject("helpers", dependencies=("tinydep",)),
            "lib/helpers/__init__.py": "import tinydep\nWHO = 'the helpers'\n",
            "lib/data/table.csv": "x\n",
        },
    )
    repo = git_repo(src, tmp_path / "study")
    output, record, store = submit(repo / "model" / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record)["helper"] == "the helpers"


def test_a_build_that_fails_names_the_source_the_backend_and_the_fix(submit, wheelhouse: Path, tmp_path: Path) -> None:
    """A backend that is not installed and one that cannot install editable (no PEP 660): the run says which
    snapshot and folder, which backend, why in at most three lines, and what to change; no traceback."""
    old = BACKEND.split("def build_editable")[0]
    write_wheel(wheelhouse, "oldback", "1.0", {"oldback/__init__.py": old.encode()})
    cases = {
        "nosuchback": ('requires = ["tinyback==1.0"]\nbuild-backend = "nosuchback.api"', "[build-system] requires"),
        "oldback": ('requires = ["oldback==1.0"]\nbuild-backend = "oldback"', "cannot build an editable install"),
    }
    for backend, (system, fix) in cases.items():
        src = tmp_path / f"src-{backend}"
        write(
            src,
            {
                "pyproject.toml": pyproject(f"pkg-{backend}", f"\n[build-system]\n{system}\n"),
                f"pkg_{backend}/__init__.py": "",
                f"pkg_{backend}/tasks.py": TASK.format(imports="", facts='"ok": 1'),
                "scan.yaml": workflow(f"pkg_{backend}.tasks:Scan"),
            },
        )
        repo = git_repo(src, tmp_path / f"repo-{backend}")
        output, record, _ = submit(repo / "scan.yaml")
        said = output + record.get("message", "")
        assert record.get("state") != "RUN_STATE_SUCCEEDED", said
        assert f"building snapshot repo-{backend} (folder .) editable with {backend}" in said, said
        assert fix in said and "package = false" in said, said
        assert "Traceback" not in said and 'File "' not in said, said


def test_a_models_own_lock_keeps_its_versions_and_a_stale_one_is_locked_again(
    submit, wheelhouse: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write(
        src,
        {
            "pyproject.toml": pyproject(),
            "locked/__init__.py": "",
            "locked/tasks.py": TASK.format(imports="", facts='"ok": 1'),
            "scan.yaml": workflow("locked.tasks:Scan"),
        },
    )
    uv = [*default_uv_command(), "lock", "--no-index", "--find-links", str(wheelhouse), "--quiet"]
    subprocess.run(uv, cwd=src, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})
    # tinydep unpinned: without the lock uv would take 2.0; the model's uv.lock says 1.0.
    (src / "pyproject.toml").write_text(pyproject(dependencies=("tinydep",)))
    repo = git_repo(src, tmp_path / "kept")
    output, record, store = submit(repo / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record)["tinydep"] == "1.0"
    assert "out of date" not in output

    (src / "pyproject.toml").write_text(pyproject(dependencies=("tinydep==2.0",)))  # the lock still says 1.0
    stale = git_repo(src, tmp_path / "stale")
    output, record, store = submit(stale / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record)["tinydep"] == "2.0"
    assert "uv.lock was out of date with its pyproject.toml: locked again (tinydep 1.0 -> 2.0)" in output, output


def test_a_dependency_from_a_git_repository_is_locked_by_commit_by_tag_and_by_branch(
    start_server, wheelhouse: Path, uv_cache: Path, tmp_path: Path
) -> None:
    """By tag and by branch, each locked by its commit; the server clones local repositories only under the
    folders its configuration names, and refuses one elsewhere before any git runs."""
    repositories = tmp_path / "repositories"
    submit = submitter(start_server(environments=offline(wheelhouse, uv_cache, local_git_roots=[repositories])))
    dep = tmp_path / "gitdep"
    write(
        dep,
        {
            "pyproject.toml": '[project]\nname = "gitdep"\nversion = "1.0"\n[build-system]\n'
            'requires = ["tinyback==1.0"]\nbuild-backend = "tinyback"\n',
            "gitdep/__init__.py": "WHICH = 'tagged'\n",
        },
    )
    upstream = git_repo(dep, repositories / "gitdep")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "tag", "v1"], cwd=upstream, check=True)
    subprocess.run([*git, "checkout", "-q", "-b", "dev"], cwd=upstream, check=True)
    (upstream / "gitdep" / "__init__.py").write_text("WHICH = 'branch'\n")
    subprocess.run([*git, "commit", "-qam", "on dev"], cwd=upstream, check=True)
    commits = {
        ref: subprocess.run(["git", "rev-parse", ref], cwd=upstream, capture_output=True, text=True).stdout.strip()
        for ref in ("v1", "dev")
    }
    for ref, which in (("v1", "tagged"), ("dev", "branch")):
        src = tmp_path / f"src-{ref}"
        write(
            src,
            {
                "pyproject.toml": pyproject(dependencies=("tinydep==1.0", f"gitdep @ git+file://{upstream}@{ref}")),
                "usesgit/__init__.py": "",
                "usesgit/tasks.py": TASK.format(imports="import gitdep", facts='"which": gitdep.WHICH'),
                "scan.yaml": workflow("usesgit.tasks:Scan"),
            },
        )
        repo = git_repo(src, tmp_path / f"model-{ref}")
        output, record, store = submit(repo / "scan.yaml")
        succeeded(output, record)
        assert summary(store, record)["which"] == which
        lock = store.run(record["run_id"]).environment_lock.read_text()
        assert commits[ref] in lock, lock

    elsewhere = git_repo(dep, tmp_path / "private" / "gitdep")
    src = tmp_path / "src-elsewhere"
    write(
        src,
        {
            "pyproject.toml": pyproject(dependencies=(f"gitdep @ git+file://{elsewhere}@main",)),
            "scan.yaml": workflow("usesgit.tasks:Scan"),
            "usesgit/__init__.py": "",
        },
    )
    output, record, _ = submit(git_repo(src, tmp_path / "model-elsewhere") / "scan.yaml")
    assert "only under environments.local_git_roots" in output and str(elsewhere) in output, output


def test_requires_python_that_no_interpreter_satisfies_is_refused_naming_the_installed_ones(
    submit, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write(
        src,
        {
            "pyproject.toml": pyproject().replace('">=3.11"', '">=3.99"'),
            "future/__init__.py": "",
            "future/tasks.py": TASK.format(imports="", facts='"ok": 1'),
            "scan.yaml": workflow("future.tasks:Scan"),
        },
    )
    repo = git_repo(src, tmp_path / "future")
    output, record, _ = submit(repo / "scan.yaml")
    assert record == {}, "nothing was recorded"
    assert "requires-python '>=3.99'" in output and f"{sys.version_info[0]}.{sys.version_info[1]}" in output, output


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs Debian's dpkg")
def test_a_system_package_this_machine_lacks_refuses_the_submission_naming_it(submit, tmp_path: Path) -> None:
    known = subprocess.run(["apt-cache", "show", "cowsay"], capture_output=True, text=True, check=False)
    installed = subprocess.run(["dpkg-query", "-W", "cowsay"], capture_output=True, check=False).returncode == 0
    if known.returncode != 0 or installed:
        pytest.skip("needs a Debian package apt knows and this machine lacks (cowsay)")
    src = tmp_path / "src"
    write(
        src,
        {
            "pyproject.toml": pyproject(extra='\n[tool.simrun]\nsystem-packages = ["cowsay", "git"]\n'),
            "needs/__init__.py": "",
            "needs/tasks.py": TASK.format(imports="", facts='"ok": 1'),
            "scan.yaml": workflow("needs.tasks:Scan"),
        },
    )
    repo = git_repo(src, tmp_path / "needs")
    output, record, _ = submit(repo / "scan.yaml")
    assert record == {}, "nothing was recorded"
    assert "cowsay is not installed on this machine" in output and "apt-get install cowsay" in output, output
    assert "git," not in output, "an installed package is not named"


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SRC_LAYOUTS = {
    "hatchling": ('requires = ["hatchling"]\nbuild-backend = "hatchling.build"', ""),
    "setuptools": ('requires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"', ""),
    "flit-core": ('requires = ["flit_core>=3.4"]\nbuild-backend = "flit_core.buildapi"', ""),
    "pdm-backend": ('requires = ["pdm-backend"]\nbuild-backend = "pdm.backend"', ""),
    "uv_build": ('requires = ["uv_build>=0.8,<0.14"]\nbuild-backend = "uv_build"', ""),
}


@pytest.mark.network
def test_src_layouts_of_every_common_backend_run_and_a_flat_layout_refusal_says_what_to_do(
    start_server, wheelhouse: Path, uv_cache: Path, tmp_path: Path
) -> None:
    """Through the package index: the five backends a src layout is built with, each installed editable;
    setuptools' refusal of a flat layout with data folders, named with its fix; and examples/pkscan (numpy)."""
    environments = EnvironmentsConfig(find_links=[str(wheelhouse)], uv_cache_dir=uv_cache, compile_bytecode=False)
    server = start_server(environments=environments)
    env = {"SIMRUN_ENDPOINT": server.address, "SIMRUN_TOKEN": "tok-alice", "COLUMNS": "200"}
    store = StoreLayout(server.config.store)

    def run(workflow_path: Path) -> tuple[str, dict]:
        result = CliRunner().invoke(cli, ["submit", str(workflow_path), "--watch"], env=env, catch_exceptions=False)
        listed = CliRunner().invoke(cli, ["list", "--json"], env=env, catch_exceptions=False)
        return result.output, json.loads(listed.output).get("runs", [{}])[0]

    for backend, (system, _) in SRC_LAYOUTS.items():
        name = f"src{backend.replace('-', '').replace('_', '')}"
        src = tmp_path / f"src-{name}"
        write(
            src,
            {
                # flit-core wants a description; every backend takes one
                "pyproject.toml": pyproject(name, f"\n[build-system]\n{system}\n").replace(
                    "dependencies", 'description = "A model."\ndependencies', 1
                ),
                "README.md": "x\n",
                f"src/{name}/__init__.py": '"""A model."""\n__version__ = "0.1.0"\n',
                f"src/{name}/tasks.py": TASK.format(imports="", facts=f'"backend": "{backend}"'),
                "scan.yaml": workflow(f"{name}.tasks:Scan"),
            },
        )
        repo = git_repo(src, tmp_path / name)
        output, record = run(repo / "scan.yaml")
        succeeded(output, record)
        assert summary(store, record)["backend"] == backend

    src = tmp_path / "src-flat"
    write(
        src,
        {
            "pyproject.toml": pyproject(
                "flatpk", '\n[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
            ),
            "flatpk/__init__.py": "",
            "flatpk/tasks.py": TASK.format(imports="", facts='"ok": 1'),
            "models/pk.xml": "<sbml/>",
            "scan.yaml": workflow("flatpk.tasks:Scan"),
        },
    )
    repo = git_repo(src, tmp_path / "flat")
    output, record = run(repo / "scan.yaml")
    said = output + record.get("message", "")
    assert "building snapshot flat (folder .) editable with setuptools.build_meta" in said, said
    assert "Multiple top-level packages discovered in a flat-layout" in said, said
    assert "[tool.setuptools] packages" in said and "[tool.uv] package = false" in said, said
    assert "Traceback" not in said, said

    # The example laid out as research code, with a real scientific dependency from the index.
    example = git_repo(EXAMPLES / "pkscan", tmp_path / "pkscan")
    output, record = run(example / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record)["rows"] == 16
    table = store.run(record["run_id"]).task("scan").root / "out" / "table" / "exposure.csv"
    assert table.read_text().splitlines()[0] == "auc_mg_h_per_l,clearance_l_per_h,cmax_mg_per_l,dose_mg,patient,tmax_h"


def test_a_uv_workspace_member_depending_on_another_member_runs(submit, tmp_path: Path) -> None:
    """The model is one member of a uv workspace and depends on another with `{ workspace = true }`: the client
    snapshots the member it uses, and the environment locks both as members of one workspace."""
    src = tmp_path / "src"
    member_source = "\n[tool.uv.sources]\nshared-tools = { workspace = true }\n"
    write(
        src,
        {
            "pyproject.toml": '[tool.uv.workspace]\nmembers = ["packages/*"]\n',
            "packages/model/pyproject.toml": pyproject("wsmodel", member_source, ("tinydep==1.0", "shared-tools")),
            "packages/model/wsmodel/__init__.py": "",
            "packages/model/wsmodel/tasks.py": TASK.format(
                imports="import shared_tools", facts='"tool": shared_tools.WHO'
            ),
            "packages/model/scan.yaml": workflow("wsmodel.tasks:Scan"),
            "packages/shared/pyproject.toml": pyproject("shared-tools", "", ("tinydep",))
            + '[build-system]\nrequires = ["tinyback==1.0"]\nbuild-backend = "tinyback"\n',
            "packages/shared/shared_tools/__init__.py": "WHO = 'a member'\n",
        },
    )
    repo = git_repo(src, tmp_path / "workspace")
    output, record, store = submit(repo / "packages" / "model" / "scan.yaml")
    succeeded(output, record)
    assert summary(store, record)["tool"] == "a member"
    assert [s["name"] for s in record["snapshots"]] == ["model", "shared"]


POISON = BACKEND.replace(
    "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):",
    """def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    cache = os.environ.get("UV_CACHE_DIR", "")
    for folder, _, names in os.walk(cache):
        for n in names:
            if n == "__init__.py" and folder.endswith("tinydep"):
                try:
                    with open(os.path.join(folder, n), "w") as f:
                        f.write("VERSION = 'poisoned'\\n")
                except OSError:
                    pass""",
)


def test_a_build_that_runs_a_submitters_code_cannot_poison_anothers_environment(
    start_server, wheelhouse: Path, tmp_path: Path
) -> None:
    """uv's cache is shared by every build of the server; a package built from source (here from git) runs its
    backend, the submitter's code, during the build. That backend rewrites every cached copy of tinydep it can
    reach: an environment built before it, and one built after it for another model, still hold the real one."""
    write_wheel(wheelhouse, "poisonback", "1.0", {"poisonback/__init__.py": POISON.encode()})
    repositories = tmp_path / "repositories"
    environments = offline(wheelhouse, tmp_path / "uv-cache", local_git_roots=[repositories])
    submit = submitter(start_server(environments=environments))

    def model(name: str, dependencies: tuple[str, ...], pin: str, copy: str = "") -> Path:
        src = tmp_path / f"src-{name}{copy}"
        write(
            src,
            {
                "pyproject.toml": pyproject(name, dependencies=(f"tinydep=={pin}", *dependencies)),
                f"{name}/__init__.py": "",
                f"{name}/tasks.py": TASK.format(imports="", facts='"ok": 1'),
                "scan.yaml": workflow(f"{name}.tasks:Scan"),
            },
        )
        return git_repo(src, tmp_path / f"{name}{copy}") / "scan.yaml"

    output, before, store = submit(model("victima", (), "1.0"))
    succeeded(output, before)
    evil = tmp_path / "evil"
    write(
        evil,
        {
            "pyproject.toml": '[project]\nname = "evil"\nversion = "1.0"\n[build-system]\n'
            'requires = ["poisonback==1.0"]\nbuild-backend = "poisonback"\n',
            "evil/__init__.py": "",
        },
    )
    upstream = git_repo(evil, repositories / "evil")
    output, attack, _ = submit(model("attacker", (f"evil @ git+file://{upstream}@main",), "2.0"))
    succeeded(output, attack)
    output, after, _ = submit(model("victimb", ("otherdep==1.0",), "2.0"))
    succeeded(output, after)
    assert summary(store, after)["tinydep"] == "2.0", "the cached tinydep was rewritten"
    # The environment built before the attack, used again by a new run (not reused), holds the real one too.
    output, again, _ = submit(model("victima", (), "1.0", copy="-again"), "--reuse", "never")
    succeeded(output, again)
    assert again["environment"] == before["environment"] and summary(store, again)["tinydep"] == "1.0"
