"""Benchmark of the environment builder on the odescan example (numpy, scipy), each figure beside a baseline.

Run: `uv run --frozen python benchmarks/envbuilder_bench.py [--runs 3]` (reaches PyPI once to fill uv's cache).
Prints, as medians of `--runs`:
- the cold build of an environment from its lock (resolve to READY) against `uv venv && uv sync --frozen` of the
  same lock in a fresh folder (goal: at most 1.2 times), and the bytecode compile that follows in the background;
- the warm resolution of the unchanged model against one `uv lock` of it (goal: under 50 ms, no uv process);
- the per-pod start overhead of a run's overlay against the start of the shared venv's interpreter (goal: < 1 s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simrun_client.snapshots import snapshot_to_store
from simrun_envbuilder.builder import BuilderSettings, EnvironmentBuilder, EnvironmentState
from simrun_envbuilder.lock import UvSettings, default_uv_command

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "odescan"
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}


def git_copy(dest: Path, code: str = "") -> Path:
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    if code:
        (dest / "odescan" / "__init__.py").write_text(f'"""odescan."""\nCODE = {code!r}\n')
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(
            ["git", *args], cwd=dest, check=True, capture_output=True, env={**GIT_ENV, "PATH": "/usr/bin:/bin"}
        )
    return dest


def wait(builder: EnvironmentBuilder, environment_id: str) -> None:
    while (environment := builder.get(environment_id)).state is EnvironmentState.BUILDING:
        time.sleep(0.01)
    if environment.state is not EnvironmentState.READY:
        raise SystemExit(f"the build failed: {environment.message}")


def counting_uv(folder: Path) -> tuple[tuple[str, ...], Path]:
    calls = folder / "uv-calls"
    calls.touch()
    wrapper = folder / "uv"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {" ".join(default_uv_command())} "$@"\n')
    wrapper.chmod(0o755)
    return (str(wrapper),), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envbuilder-bench-"))
    try:
        store = work / "store"
        model = snapshot_to_store(git_copy(work / "odescan"), store, cache_dir=work / "stat-cache").snapshot.to_ref()
        command, calls = counting_uv(work)
        settings = BuilderSettings(root=work / "envs", store=store, uv=UvSettings(command), compile_bytecode=False)
        builder = EnvironmentBuilder(settings)
        first = builder.resolve([model])  # locks (and fills uv's cache from PyPI the first time)
        wait(builder, first.environment_id)
        env_id = first.environment_id
        lock_project = builder.root / "locks" / builder.get(env_id).lock_sha256

        cold, plain, compiled = [], [], []
        for run in range(args.runs):
            shutil.rmtree(builder.root / "envs" / env_id)
            started = time.perf_counter()
            wait(builder, builder.resolve([model]).environment_id)
            cold.append(time.perf_counter() - started)
            venv = builder.root / "envs" / env_id / "venv"
            started = time.perf_counter()
            subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "compileall",
                    "-q",
                    "-j",
                    "0",
                    str(next(venv.glob("lib/python3*/site-packages"))),
                ],
                check=False,
                capture_output=True,
            )
            compiled.append(time.perf_counter() - started)
            baseline = work / f"plain-{run}"
            baseline.mkdir()
            for name in ("pyproject.toml", "uv.lock"):
                shutil.copy(lock_project / name, baseline / name)
            for wheel in lock_project.glob("*.whl"):
                shutil.copy(wheel, baseline / wheel.name)
            env = UvSettings(default_uv_command()).env()
            started = time.perf_counter()
            subprocess.run(
                [*default_uv_command(), "venv", "-q", "--python", sys.executable], cwd=baseline, env=env, check=True
            )
            subprocess.run(
                [*default_uv_command(), "sync", "-q", "--frozen", "--no-install-local"],
                cwd=baseline,
                env=env,
                check=True,
            )
            plain.append(time.perf_counter() - started)

        before = len(calls.read_text().splitlines())
        warm = []
        for _ in range(50):
            started = time.perf_counter()
            assert builder.resolve([model]).state is EnvironmentState.READY
            warm.append(time.perf_counter() - started)
        uv_started = len(calls.read_text().splitlines()) - before
        relock = []
        for _ in range(args.runs):
            started = time.perf_counter()
            subprocess.run(
                [*default_uv_command(), "lock", "-q"],
                cwd=lock_project,
                env=UvSettings(default_uv_command()).env(),
                check=True,
            )
            relock.append(time.perf_counter() - started)

        overlay, python_start = [], []
        shared = builder.get(env_id).interpreter
        for run in range(args.runs):
            ref = snapshot_to_store(
                git_copy(work / f"code-{run}", code=f"run {run}"), store, cache_dir=work / "stat-cache"
            )
            started = time.perf_counter()
            python = builder.interpreter(env_id, snapshots=[ref.snapshot.to_ref()])
            subprocess.run([python, "-c", "import odescan"], check=True)
            overlay.append(time.perf_counter() - started)
            started = time.perf_counter()
            subprocess.run([shared, "-c", "pass"], check=True)
            python_start.append(time.perf_counter() - started)

        med = statistics.median
        figures = {
            "cold_build_s": med(cold),
            "plain_uv_venv_sync_s": med(plain),
            "cold_ratio": med(c / p for c, p in zip(cold, plain, strict=True)),
            "bytecode_compile_after_ready_s": med(compiled),
            "warm_resolve_ms": med(warm) * 1000,
            "warm_uv_processes": uv_started,
            "uv_lock_unchanged_s": med(relock),
            "overlay_start_s": med(overlay),
            "python_start_s": med(python_start),
        }
        f = figures
        info = builder.get(env_id)
        print(f"environment {env_id}: {len(info.packages)} packages, Python {info.python_version}")
        print(
            f"cold build from its lock  {f['cold_build_s']:7.2f} s  vs uv venv && uv sync "
            f"{f['plain_uv_venv_sync_s']:6.2f} s  ratio {f['cold_ratio']:.2f} (goal <= 1.2)"
        )
        print(f"  then bytecode compiled after ready, in the background: {f['bytecode_compile_after_ready_s']:.2f} s")
        print(
            f"warm resolution           {f['warm_resolve_ms']:7.2f} ms vs uv lock of it "
            f"{f['uv_lock_unchanged_s'] * 1000:8.1f} ms  uv processes started: {uv_started} (goal < 50 ms, 0)"
        )
        print(
            f"overlay per pod           {f['overlay_start_s']:7.2f} s  vs the interpreter's start "
            f"{f['python_start_s']:.2f} s (goal < 1 s)"
        )
        print(json.dumps(figures))
        builder.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
