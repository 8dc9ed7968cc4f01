"""Per-run overlays on a shared venv: the run's snapshots installed editable, so runs of different code that
share one environment never see each other's code.

An overlay lives in its environment's folder, `envs/<id>/overlays/<key>/`, beside the shared venv (a pod that may
read only its snapshots, its environment and the system reads it), keyed by its snapshots (two runs of the same
snapshots share one); `runs/<id>` in it names the runs that use it, so an environment is never removed under a live
run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from simrun_core.errors import FailedPrecondition
from simrun_runtime.layout import StoreLayout
from simrun_runtime.record import SnapshotRef

from simrun_envbuilder.inputs import read_inputs
from simrun_envbuilder.venv import (
    BuildError,
    Editable,
    file_lock,
    is_ready,
    make_overlay,
    mark_ready,
    python_of,
    remove,
)


class Overlays:
    """The overlays of the environments of one machine, each in its environment's folder."""

    def __init__(self, store: StoreLayout) -> None:
        self.store = store

    def interpreter(
        self, environment_id: str, shared_python: str, snapshots: list[SnapshotRef], run_id: str | None = None
    ) -> Path:
        """The interpreter of the overlay of `snapshots` on the venv of `shared_python`, built once.

        Raises:
            FailedPrecondition: an editable install failed (e.g. a backend the environment lacks), with uv's reason.
        """
        key = hashlib.sha256(
            json.dumps([environment_id, [(s.name, s.snapshot_id) for s in snapshots]]).encode()
        ).hexdigest()[:32]
        root = overlays_of(Path(shared_python))
        folder = root / key
        if not is_ready(folder):
            with file_lock(root / f"{key}.lock"):
                if not is_ready(folder):
                    self._build(folder, environment_id, Path(shared_python), snapshots)
        runs = folder / "runs"
        runs.mkdir(exist_ok=True)
        if run_id is not None:
            (runs / run_id).touch()
        with contextlib.suppress(FileNotFoundError):
            os.utime(folder / "environment")
        return python_of(folder / "venv")

    def _build(self, folder: Path, environment_id: str, shared_python: Path, snapshots: list[SnapshotRef]) -> None:
        remove(folder)
        folder.mkdir(parents=True)
        (folder / "environment").write_text(environment_id + "\n")
        inputs = read_inputs(self.store, snapshots)
        editables = [Editable(s.root, s.folder) for s in inputs.sources if s.is_package] if inputs is not None else []
        venv = shared_python.parent.parent
        try:
            make_overlay(venv, folder / "venv", editables, folder / "overlay.log")
        except BuildError as exc:
            remove(folder)
            raise FailedPrecondition(f"the overlay of the run's snapshots failed: {exc}") from None
        mark_ready(folder)


def overlays_of(shared_python: Path) -> Path:
    """The overlays folder of the environment whose venv's interpreter is `shared_python` (`<env>/venv/bin/python`)."""
    return shared_python.parent.parent.parent / "overlays"
