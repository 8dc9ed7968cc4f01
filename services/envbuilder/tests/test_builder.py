"""The environment builder with real uv against a wheelhouse built in the session: locks, builds, overlays."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from simrun_core.errors import FailedPrecondition, InvalidArgument, NotFound
from simrun_envbuilder.builder import DEFAULT_ENVIRONMENT, BuilderSettings, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.venv import run_logged

PROBE = (
    "import tinymodel, tinydep, pydantic, simrun_runtime; from importlib.metadata import entry_points; "
    "print(tinymodel.CODE, tinydep.VERSION, sorted(e.name for e in entry_points(group='simrun.task_types')))"
)


def run_probe(python: str, code: str = PROBE) -> str:
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def build(builder: EnvironmentBuilder, kit, refs):  # type: ignore[no-untyped-def]
    environment = builder.resolve(refs)
    environment = kit.wait_ready(builder, environment.environment_id)
    assert environment.state is EnvironmentState.READY, environment.message
    # After READY the build thread records the size and collects (which may rebuild what a test then breaks).
    for thread in list(builder._threads):
        thread.join(timeout=60)
    return environment


def test_the_same_model_twice_builds_once_and_resolves_again_without_uv(builder, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files())
    first = builder.resolve([ref])
    assert first.state is EnvironmentState.BUILDING
    again = builder.resolve([ref])  # while it builds: the same build
    assert again.environment_id == first.environment_id
    ready = kit.wait_ready(builder, first.environment_id)
    assert ready.state is EnvironmentState.READY, ready.message
    assert "tinydep==1.0" in ready.packages and ready.python_version
    calls = kit.uv_calls()
    warm = builder.resolve([ref])
    assert warm.state is EnvironmentState.READY and warm.environment_id == first.environment_id
    assert kit.uv_calls() == calls, "a warm resolution started uv"
    assert [p.name for p in (builder.root / "envs").iterdir() if p.is_dir()] == [first.environment_id]
    assert run_probe(ready.interpreter, "import tinydep; print(tinydep.VERSION)") == "1.0"


def test_a_code_change_neither_locks_nor_builds(builder, kit) -> None:
    env = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(code="v1"))])
    calls = kit.uv_calls()
    changed = builder.resolve([kit.snapshot("tinymodel", kit.model_files(code="v2"))])
    assert changed.state is EnvironmentState.READY and changed.environment_id == env.environment_id
    assert kit.uv_calls() == calls
    assert len(list((builder.root / "locks").iterdir())) == 1


def test_a_dependency_change_is_a_new_environment(builder, kit) -> None:
    one = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==1.0",)))])
    two = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==2.0",)))])
    assert one.environment_id != two.environment_id
    assert run_probe(two.interpreter, "import tinydep; print(tinydep.VERSION)") == "2.0"
    # The second lock was seeded by the first (the model's previous lock) and still moved what changed.
    assert (builder.root / "models" / "tinymodel.tinymodel.lock").read_bytes() == builder.lock_of(two.environment_id)


def test_a_models_previous_lock_seeds_that_model_only_not_another_in_a_folder_of_the_same_name(builder, kit) -> None:
    """Seeding keeps a model's versions from one lock to the next; another project whose folder happens to have the
    same name (`model`, `src`) must not inherit them."""
    alpha = build(builder, kit, [kit.snapshot("model", kit.model_files(name="alpha", dependencies=("tinydep<2",)))])
    assert "tinydep==1.0" in alpha.packages
    beta = build(builder, kit, [kit.snapshot("model", kit.model_files(name="beta", dependencies=("tinydep",)))])
    assert "tinydep==2.0" in beta.packages, "beta was locked with alpha's lock as its seed"
    again = build(builder, kit, [kit.snapshot("model", kit.model_files(name="alpha", dependencies=("tinydep",)))])
    assert "tinydep==1.0" in again.packages, "alpha's own previous lock keeps its version"


def test_a_models_uv_lock_that_uv_cannot_read_is_left_out_and_said(builder, kit, caplog) -> None:
    files = {**kit.model_files(), "uv.lock": "garbage = [\n"}
    with caplog.at_level("WARNING", logger="simrun_envbuilder.lock"):
        env = build(builder, kit, [kit.snapshot("tinymodel", files)])
    assert "tinydep==1.0" in env.packages
    assert any("was not usable, locked afresh" in r.getMessage() for r in caplog.records), caplog.text


def test_a_new_comment_in_the_pyproject_locks_again_but_builds_nothing(builder, kit) -> None:
    one = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files())])
    two = builder.resolve([kit.snapshot("tinymodel", kit.model_files(extra="# a comment\n"))])
    assert two.environment_id == one.environment_id and two.state is EnvironmentState.READY


def test_two_runs_of_different_code_on_one_environment_see_their_own_code(builder, kit, tmp_path: Path) -> None:
    refs = {code: kit.snapshot("tinymodel", kit.model_files(code=code)) for code in ("red", "blue")}
    env = build(builder, kit, [refs["red"]])
    assert builder.resolve([refs["blue"]]).environment_id == env.environment_id
    for code, ref in refs.items():
        run = builder.store.run(f"run-{code}")
        run.root.mkdir(parents=True)
        run.record.write_text(
            json.dumps({"run_id": f"run-{code}", "state": "running", "snapshots": [ref.model_dump()]})
        )
    results: dict[str, str] = {}

    def run_pod(code: str) -> None:
        python = builder.interpreter(env.environment_id, run_id=f"run-{code}")
        results[code] = run_probe(python)

    threads = [threading.Thread(target=run_pod, args=(code,)) for code in refs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == {"red": "red 1.0 ['tinymodel']", "blue": "blue 1.0 ['tinymodel']"}
    lock = builder.store.run("run-red").environment_lock.read_bytes()
    assert lock == builder.lock_of(env.environment_id) and b'name = "tinydep"' in lock
    assert b"snapshots/" not in lock, "the lock names a snapshot"


def test_a_library_beside_the_model_locks_and_runs(builder, kit) -> None:
    lib = kit.snapshot(
        "lib",
        {
            "pyproject.toml": '[project]\nname = "tinylib"\nversion = "0.2.0"\ndependencies = ["tinydep==2.0"]\n'
            '[build-system]\nrequires = ["tinyback==1.0"]\nbuild-backend = "tinyback"\n',
            "tinylib/__init__.py": "WHO = 'lib'\n",
        },
    )
    files = kit.model_files(dependencies=("tinylib",), extra='\n[tool.uv.sources]\ntinylib = { path = "../lib" }\n')
    model = kit.snapshot("tinymodel", files)
    env = build(builder, kit, [model, lib])
    assert "tinydep==2.0" in env.packages
    python = builder.interpreter(env.environment_id, snapshots=[model, lib])
    assert run_probe(python, "import tinylib, tinydep, tinymodel; print(tinylib.WHO, tinydep.VERSION)") == "lib 2.0"
    with pytest.raises(InvalidArgument, match="no snapshot 'lib'"):
        builder.resolve([model])


@pytest.mark.parametrize(
    ("dependency", "said"),
    [("nosuchpackage", "nosuchpackage"), ("tinydep==9.0", "tinydep"), ("tinydep[=1", "tinydep")],
)
def test_an_unlockable_pyproject_is_refused_with_uvs_reason(builder, kit, dependency: str, said: str) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files(dependencies=(dependency,)))
    with pytest.raises(InvalidArgument, match="cannot be locked") as refused:
        builder.resolve([ref])
    assert said in str(refused.value)
    assert not list((builder.root / "inputs").glob("*.json")) and not list((builder.root / "tmp").iterdir())


def test_a_conflict_is_refused(builder, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==1.0", "otherdep")))
    with pytest.raises(InvalidArgument, match="otherdep"):
        builder.resolve([ref])


def test_a_python_nothing_installed_satisfies_is_refused_naming_what_is(builder, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files(requires_python=">=3.99"))
    with pytest.raises(InvalidArgument, match=r"installed: .*3\.11"):
        builder.resolve([ref])


def test_an_unknown_debian_package_is_refused_before_any_build(builder, kit) -> None:
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt-cache on this machine")
    files = kit.model_files(extra='\n[tool.simrun]\nsystem-packages = ["no-such-package-simrun"]\n')
    with pytest.raises(InvalidArgument, match="no-such-package-simrun"):
        builder.resolve([kit.snapshot("tinymodel", files)])
    assert kit.uv_calls() == 0


def test_a_model_without_pyproject_runs_in_the_default_environment(builder, kit) -> None:
    env = builder.resolve([kit.snapshot("plain", {"plain.py": "X = 1\n"})])
    assert env.environment_id == DEFAULT_ENVIRONMENT and env.state is EnvironmentState.READY
    assert builder.interpreter(DEFAULT_ENVIRONMENT, snapshots=[]) == env.interpreter
    assert kit.uv_calls() == 0


def test_a_build_that_fails_leaves_nothing_and_says_why(settings: BuilderSettings, kit, wheelhouse: Path) -> None:
    own, cache = Path(settings.root).parent / "own-wheelhouse", Path(settings.root).parent / "own-cache"
    shutil.copytree(wheelhouse, own)
    uv = replace(settings.uv, cache_dir=cache, find_links=(str(own),))
    builder = EnvironmentBuilder(replace(settings, uv=uv))
    try:
        ref = kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==2.0",)))
        env = build(builder, kit, [ref])
        # The environment is gone (removed by age), and so are the wheel and uv's cache of it: the rebuild fails.
        shutil.rmtree(builder.root / "envs" / env.environment_id)
        shutil.rmtree(cache)
        for wheel in own.glob("tinydep-2.0-*.whl"):
            wheel.unlink()
        assert builder.resolve([ref]).state is EnvironmentState.BUILDING
        failed = kit.wait_ready(builder, env.environment_id)
        assert failed.state is EnvironmentState.FAILED
        assert "uv sync failed" in failed.message and "tinydep" in failed.message and "log tail" in failed.message
        assert not (builder.root / "envs" / env.environment_id).exists()
        with pytest.raises(FailedPrecondition):
            builder.interpreter(env.environment_id)
    finally:
        builder.close()


def test_a_half_built_environment_is_rebuilt(builder, kit) -> None:
    env = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files())])
    folder = builder.root / "envs" / env.environment_id
    (folder / "ready").unlink()
    shutil.rmtree(folder / "venv" / "lib")
    again = builder.resolve([kit.snapshot("tinymodel", kit.model_files())])
    assert again.state is EnvironmentState.BUILDING
    rebuilt = kit.wait_ready(builder, env.environment_id)
    assert rebuilt.state is EnvironmentState.READY
    assert run_probe(rebuilt.interpreter, "import tinydep; print(tinydep.VERSION)") == "1.0"


def test_old_environments_go_by_age_but_not_one_a_live_run_uses(builder, kit) -> None:
    old = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==1.0",)))])
    live_ref = kit.snapshot("other", kit.model_files(name="other", dependencies=("tinydep==2.0",)))
    live = build(builder, kit, [live_ref])
    run = builder.store.run("live-run")
    run.root.mkdir(parents=True)
    run.record.write_text(json.dumps({"run_id": "live-run", "state": "running", "snapshots": [live_ref.model_dump()]}))
    builder.interpreter(live.environment_id, run_id="live-run")
    later = time.time() + builder.settings.max_age_s + 10
    removed = builder.collect(now=later)
    assert removed == [old.environment_id]
    with pytest.raises(NotFound):
        builder.get(old.environment_id)
    assert builder.get(live.environment_id).state is EnvironmentState.READY
    run.record.write_text(json.dumps({"run_id": "live-run", "state": "succeeded", "snapshots": []}))
    assert builder.collect(now=later) == [live.environment_id]


def test_list_and_watch(builder, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files())
    environment = builder.resolve([ref])
    updates = list(builder.watch(environment.environment_id, poll_s=0.05))
    assert updates[-1][0].state is EnvironmentState.READY
    lines = [line for _, batch in updates for line in batch]
    assert any("installing the locked packages" in line for line in lines)
    # The steps with their times and uv's own counts; no line of uv's that names a path here.
    assert any(re.fullmatch(r"uv sync: Installed \d+ packages? in \S+", line) for line in lines), lines
    assert any(re.fullmatch(r"uv sync: done in \d+\.\d s", line) for line in lines), lines
    assert not any(str(builder.root) in line or "/venv" in line for line in lines), lines
    assert [e.environment_id for e in builder.list_environments()] == [environment.environment_id]


def test_a_build_step_shows_a_tools_whole_status_lines_and_never_a_fragment(tmp_path: Path) -> None:
    """uv's warning about hard links spans three lines; cut into the progress line it read as nonsense."""
    tool_output = [
        "Using CPython 3.11.7 interpreter at: /usr/bin/python3",
        "Resolved 3 packages in 2ms",
        "warning: Failed to hardlink files; falling back to full copy. This may lead to degraded performance.",
        "         If the cache and target directories are on different filesystems, hardlinking may not be supported.",
        "         If this is intentional, set `export UV_LINK_MODE=copy` or use `--link-mode=copy` to suppress this.",
        "Downloading numpy (16.1MiB)",
        "Prepared 2 packages in 480ms",
        "Installed 3 packages in 9ms",
        " + numpy==2.4.6",
    ]
    script = tmp_path / "tool.sh"
    script.write_text("".join(f"printf '%s\\n' {shlex.quote(line)}\n" for line in tool_output))
    shown: list[str] = []
    log = tmp_path / "build.log"
    run_logged(["bash", str(script)], "uv sync", log, shown.append, {"PATH": "/usr/bin:/bin"})
    assert shown[:-1] == [
        "uv sync: Resolved 3 packages in 2ms",
        "uv sync: Downloading numpy (16.1MiB)",
        "uv sync: Prepared 2 packages in 480ms",
        "uv sync: Installed 3 packages in 9ms",
    ]
    assert re.fullmatch(r"uv sync: done in \d+\.\d s", shown[-1])
    assert all(line in log.read_text() for line in tool_output)  # the log keeps every line


def test_two_builders_on_one_folder_lock_and_build_once(settings: BuilderSettings, kit) -> None:
    ref = kit.snapshot("tinymodel", kit.model_files())
    builders = [EnvironmentBuilder(settings), EnvironmentBuilder(settings)]  # two server processes, one machine
    try:
        found: list[str] = []
        threads = [threading.Thread(target=lambda b=b: found.append(b.resolve([ref]).environment_id)) for b in builders]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(set(found)) == 1 and len(found) == 2
        for builder in builders:
            assert kit.wait_ready(builder, found[0]).state is EnvironmentState.READY
        calls = kit.calls.read_text().splitlines()
        assert sum(line.startswith("lock") for line in calls) == 1
        assert sum(line.startswith("sync") for line in calls) == 1
    finally:
        for builder in builders:
            builder.close()


def test_beyond_the_total_size_the_least_recently_used_go_first_but_never_a_recent_one(
    settings: BuilderSettings, kit
) -> None:
    builder = EnvironmentBuilder(replace(settings, max_total_bytes=1))
    try:
        old = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==1.0",)))])
        new = build(builder, kit, [kit.snapshot("tinymodel", kit.model_files(dependencies=("tinydep==2.0",)))])
        assert builder.collect() == []  # both over the size, both used within the hour
        hours_ago = time.time() - 2 * 3600
        os.utime(builder.root / "envs" / old.environment_id / "last_use", (hours_ago, hours_ago))
        assert builder.collect() == [old.environment_id]
        assert builder.get(new.environment_id).state is EnvironmentState.READY
    finally:
        builder.close()


def test_a_build_that_died_with_its_server_is_built_again_by_the_next_one(settings: BuilderSettings, kit) -> None:
    first = EnvironmentBuilder(settings)
    env = build(first, kit, [kit.snapshot("tinymodel", kit.model_files())])
    first.close()
    # What a server killed mid-build leaves: the folder without its ready mark, the pending record, no lock held.
    folder = Path(settings.root) / "envs" / env.environment_id
    (folder / "ready").unlink()
    shutil.rmtree(folder / "venv")
    restarted = EnvironmentBuilder(settings)
    try:
        assert restarted.get(env.environment_id).state is EnvironmentState.BUILDING  # the driver only asks `get`
        again = kit.wait_ready(restarted, env.environment_id)
        assert again.state is EnvironmentState.READY
        assert run_probe(again.interpreter, "import tinydep; print(tinydep.VERSION)") == "1.0"
    finally:
        restarted.close()
