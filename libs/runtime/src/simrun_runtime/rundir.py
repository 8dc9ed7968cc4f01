"""Laying out a run directory for one task by hand (`simrun-rundir`), so a worker runs with no service at all.

    simrun-rundir STORE RUN_ID TASK_ID --type toymodel:Scan --model-root ~/model --settings '{"points": 8}'

writes `STORE/runs/RUN_ID/run.json` (adding the task if the run exists), `tasks/TASK_ID/settings.json` and
`tasks/TASK_ID/provenance.json`, and prints the variables to start `simrun-worker` or `simrun-exec` with.
"""

from __future__ import annotations

import argparse
import getpass
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from simrun_runtime.files import write_json_atomic
from simrun_runtime.layout import RunLayout, StoreLayout
from simrun_runtime.record import Identity, Provenance, RunRecord, RunState, SnapshotRef, TaskRecord

MODEL_SNAPSHOT = "model"


def git_provenance(root: Path) -> Provenance:
    """The branch, commit and changed files of the git working tree at `root`, if it is one."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return Provenance()
    changed = [line[3:] for line in (git("status", "--porcelain") or "").splitlines() if len(line) > 3]
    return Provenance(
        branch=git("rev-parse", "--abbrev-ref", "HEAD"), commit=commit, changed_files=changed, dirty=bool(changed)
    )


def lay_out_run(
    store_root: Path | str,
    run_id: str,
    task_id: str,
    type: str,
    settings: dict[str, Any],
    model_root: Path | str,
    inputs: dict[str, str] | None = None,
) -> RunLayout:
    """Lays out `runs/<run_id>/` with the task `task_id` of `type` and `settings`, the model at `model_root`
    (its absolute path as the run's first snapshot) and `inputs` (port -> `<task>.<port>`). Settings are
    written as given, not validated: the pod validates them, as it would for a submitted run."""
    store = StoreLayout(Path(store_root).resolve())
    run = store.run(run_id)
    root = Path(model_root).resolve()
    provenance = git_provenance(root)
    if run.record.exists():
        record = RunRecord.load(run)
    else:
        record = RunRecord(
            run_id=run_id,
            identity=Identity(name=getpass.getuser(), kind="person", priority="standard"),
            state=RunState.RUNNING,
            snapshots=[SnapshotRef(name=MODEL_SNAPSHOT, snapshot_id="local", path=str(root), provenance=provenance)],
        )
    record.tasks[task_id] = TaskRecord(task_id=task_id, type=type, inputs=dict(inputs or {}))
    task = run.task(task_id)
    task.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(task.settings, settings)
    write_json_atomic(task.provenance, provenance.model_dump(mode="json"))
    record.save(run)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="simrun-rundir", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("store", type=Path, help="the store root (runs/ is created under it)")
    parser.add_argument("run_id")
    parser.add_argument("task_id")
    parser.add_argument("--type", required=True, help="`module:Class` or a simrun.task_types entry point")
    parser.add_argument("--model-root", type=Path, required=True, help="the model's folder, first on sys.path")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--settings", default="{}", help="the settings as a JSON object")
    group.add_argument("--settings-file", type=Path, help="a JSON file of the settings")
    parser.add_argument("--input", action="append", default=[], metavar="PORT=TASK.PORT", help="connect an input port")
    args = parser.parse_args(argv)
    try:
        settings = json.loads(args.settings_file.read_text() if args.settings_file else args.settings)
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"settings: {exc}")
    if not isinstance(settings, dict):
        parser.error("settings must be a JSON object")
    inputs = {}
    for item in args.input:
        port, sep, source = item.partition("=")
        if not sep or "." not in source:
            parser.error(f"--input {item!r} must be PORT=TASK.PORT")
        inputs[port] = source
    if not args.model_root.is_dir():
        parser.error(f"--model-root {args.model_root} is not a directory")
    run = lay_out_run(args.store, args.run_id, args.task_id, args.type, settings, args.model_root, inputs)
    task = run.task(args.task_id)
    print(
        f"SIMRUN_RUN_DIR={shlex.quote(str(run.root))} SIMRUN_TASK={shlex.quote(args.task_id)} "
        f"SIMRUN_PROVENANCE={shlex.quote(str(task.provenance))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
